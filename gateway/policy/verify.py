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
from gateway.policy.node import Node
from gateway.policy.secrets import resolve

_F = frozenset
_HOST_RE = re.compile(r"^[A-Za-z0-9.:_-]+$")
MIN_ADMIN_TOKEN_BYTES = 16


def _canary(node: Node) -> CanarySettings | None:
    if node.node.tag == "tag:yaml.org,2002:bool":
        if node.boolean():
            return CanarySettings()
        return None
    f = node.mapping(_F(), _F(CanarySettings.__slots__))
    d = CanarySettings()
    return CanarySettings(
        interval_s=f["interval_s"].positive() if "interval_s" in f else d.interval_s,
        prompt_tokens=f["prompt_tokens"].integer(64, 16384)
        if "prompt_tokens" in f
        else d.prompt_tokens,
        on_shared=OnShared(f["on_shared"].choice(tuple(OnShared)))
        if "on_shared" in f
        else d.on_shared,
        clean_rounds=f["clean_rounds"].integer(1, 1000) if "clean_rounds" in f else d.clean_rounds,
        timing_samples=f["timing_samples"].integer(2, 64)
        if "timing_samples" in f
        else d.timing_samples,
    )


def _detective(node: Node, base: Path) -> DetectiveSettings | None:
    if node.node.tag == "tag:yaml.org,2002:bool":
        return DetectiveSettings() if node.boolean() else None
    f = node.mapping(_F(), _F(DetectiveSettings.__slots__))
    d = DetectiveSettings()
    tokenizer = None
    if "tokenizer" in f:
        tokenizer = base / f["tokenizer"].text()
        if not (tokenizer / "tokenizer.json").is_file():
            f["tokenizer"].fail(f"{tokenizer}: no tokenizer.json there (a Hugging Face model dir)")
    return DetectiveSettings(
        tokenizer=tokenizer,
        block_size=f["block_size"].integer(1, 4096) if "block_size" in f else d.block_size,
        template_overhead_tokens=f["template_overhead_tokens"].integer(0, 1 << 16)
        if "template_overhead_tokens" in f
        else d.template_overhead_tokens,
        message_overhead_tokens=f["message_overhead_tokens"].integer(0, 4096)
        if "message_overhead_tokens" in f
        else d.message_overhead_tokens,
    )


def read_verify(node: Node, base: Path) -> VerifySettings:
    f = node.mapping(_F(), _F({"canary", "detective"}))
    d = VerifySettings()
    return VerifySettings(
        canary=_canary(f["canary"]) if "canary" in f else d.canary,
        detective=_detective(f["detective"], base) if "detective" in f else d.detective,
    )


def read_admin(node: Node, env: Mapping[str, str], base: Path) -> AdminSettings:
    f = node.mapping(_F(), _F({"host", "port", "token"}))
    d = AdminSettings()
    return AdminSettings(
        host=f["host"].text(_HOST_RE) if "host" in f else d.host,
        port=f["port"].integer(0, 65535) if "port" in f else d.port,
        token=resolve(f["token"], env, base, MIN_ADMIN_TOKEN_BYTES) if "token" in f else None,
    )


def read_history(node: Node) -> HistorySettings:
    f = node.mapping(_F(), _F({"capacity", "block_max_age_s"}))
    d = HistorySettings()
    age = d.block_max_age_s
    if "block_max_age_s" in f:
        age = float(f["block_max_age_s"].integer(0, 365 * 86400))
    return HistorySettings(
        capacity=f["capacity"].integer(1024, 1 << 28) if "capacity" in f else d.capacity,
        block_max_age_s=age,
    )
