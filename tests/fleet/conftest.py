"""A real redis-server per test (skipped, with the reason, where it is not installed)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fleet.redis_server import RedisServer, need_redis


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    need_redis()
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    yield server
    server.stop()
