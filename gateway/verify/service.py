"""What one gateway worker holds for verification: the history and its detective, the shared
backend health board, the marker key, and the state directory they live in.

Invariant: every worker of one gateway opens the same state directory (and, with
`gateway.shared`, every replica the same Redis, which then holds the history and the board), so
a quarantine decided by one worker is honoured by all of them within `health.REFRESH_S`, and a
prefix any of them recorded explains a hit any of them judges.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import shutil
import tempfile
from pathlib import Path

from aiohttp import web

from gateway.fleet.local_health import HealthBoard
from gateway.policy.model import Policy
from gateway.verify.detective import Detective
from gateway.verify.history import History
from gateway.verify.markers import MarkerKey
from gateway.verify.store import FingerprintStore

log = logging.getLogger("kvfence.gateway.verify")


def state_dir_for(policy: Policy) -> tuple[Path, bool]:
    """The policy's state directory (created 0700), or a fresh private temp directory; the flag
    says whether it is temporary (removed by whoever made it)."""
    configured = policy.gateway.state_dir
    if configured is None:
        return Path(tempfile.mkdtemp(prefix="kvfence-state-")), True
    configured.mkdir(mode=0o700, parents=True, exist_ok=True)
    return configured, False


class Verification:
    def __init__(self, policy: Policy, state_dir: Path) -> None:
        secret = hmac.new(
            policy.gateway.active_key.secret.value, b"kvfence verify v1", hashlib.sha256
        ).digest()
        history = policy.gateway.history
        self.state_dir = state_dir
        self.secret = secret
        self.store: History = FingerprintStore(
            state_dir / "history.bin", history.capacity, history.tenant_cap
        )
        self.detective = Detective(self.store, secret)
        self.detective.preload(
            b.verify.detective.tokenizer
            for b in policy.backends
            if b.verify and b.verify.detective and b.verify.detective.tokenizer
        )
        self.health = HealthBoard(state_dir / "health.json")
        self.markers = MarkerKey(secret)
        self.canary_lock = state_dir / "canary.lock"

    def use_history(self, history: History) -> None:
        """Judge against `history` (the replicas' shared one) instead of the local file."""
        self.store.close()
        self.store = self.detective.history = history

    def close(self) -> None:
        self.store.close()


VERIFY = web.AppKey("kvfence_verify", Verification)


def remove_state_dir(path: Path) -> None:
    """Remove a temporary state directory (only its creator calls this)."""
    if path.name.startswith("kvfence-state-") and path.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(path, ignore_errors=True)
    else:  # pragma: no cover - never a configured directory
        log.warning("not removing state directory", extra={"path": os.fspath(path)})
