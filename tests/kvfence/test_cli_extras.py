"""A command whose module is missing names an extra that really provides it: every module the
CLI's table names is a dependency of that extra in pyproject.toml, and the message says how to
install it."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from kvfence.cli import EXTRA_OF_COMMAND, EXTRA_OF_MODULE, extra_for

ROOT = Path(__file__).resolve().parents[2]
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]
# Import name -> distribution name, where they differ.
DIST = {
    "prometheus_client": "prometheus-client",
    "jinja2": "jinja2",
    "opentelemetry": "opentelemetry-sdk",
}


def _dists(extra: str) -> set[str]:
    return {re.split(r"[<>=!~; \[]", req, maxsplit=1)[0].lower() for req in EXTRAS[extra]}


@pytest.mark.parametrize("module", sorted(EXTRA_OF_MODULE))
def test_each_module_is_in_the_extra_named_for_it(module: str) -> None:
    extra = EXTRA_OF_MODULE[module]
    assert DIST.get(module, module).lower() in _dists(extra), (module, extra)


def test_commands_name_their_own_extra_for_shared_modules() -> None:
    assert set(EXTRA_OF_COMMAND.values()) <= set(EXTRAS)
    assert "aiohttp" in _dists("gateway") and "aiohttp" in _dists("probe")
    assert extra_for("probe", "aiohttp") == "probe"
    assert extra_for("gateway", "aiohttp") == "gateway"
    assert extra_for("gateway", "redis.asyncio") == "redis"
    assert extra_for("backend", "torch") == "backend"
    assert extra_for("gateway", "tokenizers") == "tokenizer"  # the exact-mode detective's
    assert extra_for("backend", "tokenizers") == "backend"
    assert {"tokenizers", "jinja2"} <= _dists("backend") & _dists("tokenizer")
