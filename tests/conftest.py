"""Fixtures every test folder shares: the real SmolLM2 loaded once per session, a tiny random
Llama (`tests.kit.models`), and a real redis-server or PostgreSQL per test that needs one.
torch is imported by the fixtures that need it, never for a test that does not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.kit.postgres_server import PostgresServer, need_postgres
from tests.kit.redis_server import RedisServer, need_redis

if TYPE_CHECKING:
    from backend.model import LoadedModel
    from backend.model.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    from tests.kit.models import byte_tokenizer

    return byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer: Tokenizer) -> LoadedModel:
    """A 2-layer random Llama in float32 (GQA: 4 query heads over 2 KV heads)."""
    import torch

    from backend.model import LoadedModel
    from backend.model.weights import build_llama
    from tests.kit.models import TEST_DEVICE, TINY, tiny_tensors

    model = build_llama(TINY, tiny_tensors(), TEST_DEVICE, torch.float32)
    return LoadedModel(model, TINY, tiny_tokenizer, TEST_DEVICE, torch.float32, "tiny")


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The real SmolLM2-135M-Instruct with the default dtype, loaded once."""
    from backend.model import load_model
    from tests.kit.models import TEST_DEVICE

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
