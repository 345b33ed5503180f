"""Fixtures every test folder shares: the real SmolLM2 loaded once per session, a tiny random
Llama (`tests.kit.models`), and a real redis-server per test that needs one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from backend.model import LoadedModel, load_model
from backend.model.tokenizer import Tokenizer
from backend.model.weights import build_llama
from tests.kit.models import TEST_DEVICE, TINY, byte_tokenizer, tiny_tensors
from tests.kit.postgres_server import PostgresServer, need_postgres
from tests.kit.redis_server import RedisServer, need_redis


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer: Tokenizer) -> LoadedModel:
    """A 2-layer random Llama in float32 (GQA: 4 query heads over 2 KV heads)."""
    model = build_llama(TINY, tiny_tensors(), TEST_DEVICE, torch.float32)
    return LoadedModel(model, TINY, tiny_tokenizer, TEST_DEVICE, torch.float32, "tiny")


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The real SmolLM2-135M-Instruct with the default dtype, loaded once."""
    return load_model("smollm2", device=str(TEST_DEVICE))


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    need_postgres()
    server = PostgresServer()
    server.init()
    yield server
    server.remove()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    need_redis()
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    yield server
    server.stop()
