"""Interop fixtures: one real vLLM for the whole session, skipped when its environment is absent.

Invariant: with KVFENCE_REQUIRE_VLLM=1 (or a build beside the suite that ended well) a missing
vLLM environment fails the tests instead of skipping them, so CI that promises interop coverage
cannot pass without it.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests.kit.vllm_server import BUILDING, VllmConfig, missing_reason, running_vllm


def _required() -> bool:
    return os.environ.get("KVFENCE_REQUIRE_VLLM") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(BUILDING):  # built beside the suite: each test decides once it is done
        return
    reason = missing_reason()
    if reason is None or _required():
        return
    skip = pytest.mark.skip(reason=f"vLLM interop tests skipped: {reason}")
    for item in items:
        if item.get_closest_marker("vllm") is not None:
            item.add_marker(skip)


def _present() -> None:
    """vLLM's environment is here, or the test is skipped (failed where it is required)."""
    reason = missing_reason()
    if reason is None:
        return
    if _required():
        pytest.fail(f"KVFENCE_REQUIRE_VLLM=1 but {reason}", pytrace=False)
    pytest.skip(f"vLLM interop tests skipped: {reason}")


@pytest.fixture(autouse=True)
def _vllm_present(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("vllm") is not None:
        _present()


@pytest.fixture(scope="session")
def vllm_url() -> Iterator[str]:
    """Base URL of a real vLLM serving SmolLM2 as `smollm2` with prefix caching on."""
    _present()
    with running_vllm() as url:
        yield url


@pytest.fixture(scope="session")
def uncached_vllm_url() -> Iterator[str]:
    """A second real vLLM with prefix caching off (started once, for the tests that need it)."""
    _present()
    with running_vllm(VllmConfig(extra_args=("--no-enable-prefix-caching",))) as url:
        yield url


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        yield session
