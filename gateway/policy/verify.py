"""Reading the policy's verification settings: a backend's `verify` (canary, detective), and the
gateway's `admin`, `state_dir` and `history`.

Invariant: every number is range-checked here; a tokenizer directory is checked for its
`tokenizer.json` at load, never at request time.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from gateway.policy.backend_model import CanarySettings, DetectiveSettings, OnShared, VerifySettings
from gateway.policy.model import AdminSettings, HistorySettings
from gateway.policy.node import Node, optional
from gateway.policy.secrets import resolve
from gateway.policy.sources import note

_F = frozenset
_HOST_RE = re.compile(r"^[A-Za-z0-9.:_-]+$")
MIN_ADMIN_TOKEN_BYTES = 16


def _canary(node: Node) -> CanarySettings | None:
    if node.node.tag == "tag:yaml.org,2002:bool":
        if node.boolean():
            return CanarySettings()
        return None
    f = node.mapping(_F(), _F(CanarySettings.__slots__))
    return CanarySettings(
        **optional(
            f,
            interval_s=Node.positive,
            prompt_tokens=lambda n: n.integer(64, 16384),
            on_shared=lambda n: OnShared(n.choice(tuple(OnShared))),
            clean_rounds=lambda n: n.integer(1, 1000),
            jitter=lambda n: n.number(0.0, 0.9),
            timing_budget=lambda n: n.integer(10, 1000),
            timing_alpha=lambda n: n.number(1e-12, 0.01),
            trigger_interval_s=lambda n: n.number(0.0, 86400.0),
            max_share=lambda n: n.number(0.0, 1.0),
        )
    )


def _detective(node: Node, base: Path) -> DetectiveSettings | None:
    if node.node.tag == "tag:yaml.org,2002:bool":
        return DetectiveSettings() if node.boolean() else None
    f = node.mapping(_F(), _F(DetectiveSettings.__slots__))
    return DetectiveSettings(
        **optional(
            f,
            tokenizer=lambda n: _tokenizer(n, base),
            block_size=lambda n: n.integer(1, 4096),
            template_overhead_tokens=lambda n: n.integer(0, 1 << 16),
            message_overhead_tokens=lambda n: n.integer(0, 4096),
        )
    )


def _tokenizer(node: Node, base: Path) -> Path:
    folder = base / node.text()
    note(folder / "tokenizer.json")
    if not (folder / "tokenizer.json").is_file():
        node.fail(f"{folder}: no tokenizer.json there (a Hugging Face model dir)")
    return folder


def read_verify(node: Node, base: Path) -> VerifySettings:
    f = node.mapping(_F(), _F({"canary", "detective"}))
    return VerifySettings(**optional(f, canary=_canary, detective=lambda n: _detective(n, base)))


def read_admin(node: Node, env: Mapping[str, str], base: Path) -> AdminSettings:
    f = node.mapping(_F(), _F({"host", "port", "token"}))
    return AdminSettings(
        **optional(
            f,
            host=lambda n: n.text(_HOST_RE),
            port=lambda n: n.integer(0, 65535),
            token=lambda n: resolve(n, env, base, MIN_ADMIN_TOKEN_BYTES),
        )
    )


def read_history(node: Node) -> HistorySettings:
    f = node.mapping(_F(), _F({"capacity", "tenant_cap", "block_max_age_s"}))
    history = HistorySettings(
        **optional(
            f,
            block_max_age_s=lambda n: float(n.integer(0, 365 * 86400)),
            capacity=lambda n: n.integer(1024, 1 << 28),
            tenant_cap=lambda n: n.integer(64, 1 << 28),
        )
    )
    if history.tenant_cap > history.capacity:
        (f.get("tenant_cap") or node).fail("tenant_cap cannot exceed capacity")
    return history
