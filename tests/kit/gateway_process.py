"""The real `kvfence gateway` CLI as a subprocess (its own workers, its own state directory), for
tests that need what only a process has: several workers, restarts."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.kit.polling import until_sync


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@contextlib.contextmanager
def gateway_process(
    policy: Path, url: str, workers: int = 2, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Run the gateway on `policy` until the block ends; enter once `url` answers /readyz."""
    command = [sys.executable, "-m", "kvfence.cli", "gateway", "--policy", str(policy)]
    command += ["--workers", str(workers), "--log-level", "warning"]
    log = policy.with_suffix(".log").open("ab")
    proc = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
    )
    try:
        if not until_sync(lambda: proc.poll() is not None or _ready(url), 60, 0.1):
            raise RuntimeError("the gateway did not become ready")
        if proc.poll() is not None:
            raise RuntimeError(f"the gateway exited: {policy.with_suffix('.log').read_text()}")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
