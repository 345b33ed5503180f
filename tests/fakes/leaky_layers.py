"""Leaky layers for the verification tests: rules a careless layer between the gateway and the
server has dropped the scope by, for `RewritingProxy(when=...)` (tests/fakes/
salt_dropping_proxy.py), in front of a fake server or a real vLLM. Each is a class of partial
failure the canary rounds and the detective must catch.

Named fakes: they stand in for third-party layers (API gateways, proxies, offload tiers) that
cannot run here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from tests.fakes.salt_dropping_proxy import When


def by_size(limit: int) -> When:
    """Drops the scope for bodies over `limit` bytes (a layer with a size-based slow path)."""
    return lambda path, body: len(orjson.dumps(body)) > limit


def by_path(suffix: str) -> When:
    """Drops the scope on one path only (a layer that forgot `cache_salt` on one endpoint)."""
    return lambda path, body: path.endswith(suffix)


def by_stream(path: str, body: dict[str, Any]) -> bool:
    """Drops the scope for streamed requests only."""
    return bool(body.get("stream"))


def by_messages(least: int) -> When:
    """Drops the scope for conversations of at least `least` messages."""
    return lambda path, body: len(body.get("messages") or body.get("input") or []) >= least


def by_field(name: str) -> When:
    """Drops the scope when a sampling field is present (a layer keyed on it)."""
    return lambda path, body: name in body


@dataclass
class Switch:
    """Drops the scope from the moment `on` is set (a layer that starts leaking after the last
    canary round: a deploy, a config reload, a failover to a careless replica)."""

    on: bool = False

    def __call__(self, path: str, body: dict[str, Any]) -> bool:
        return self.on
