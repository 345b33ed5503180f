"""`scripts/sidecar` from a fresh clone (its own fresh `.venv`, a user's environment), in front of
the session's real vLLM, as the README tells a newcomer to run it (with `--tokenizer`, the
detective's exact mode the README recommends): it ends with the isolation
proven by `kvfence probe`, `scripts/sidecar check` proves it again, the audit command it prints
verifies both workers' chains, and Ctrl-C stops everything it started."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.kit.fresh_env import clone as fresh_clone
from tests.kit.fresh_env import user_env
from tests.kit.vllm_server import MODEL_DIR

READY = "Ctrl-C stops everything this script started."


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _read_until(proc: subprocess.Popen[str], marker: str, deadline_s: float) -> str:
    assert proc.stdout is not None
    out: list[str] = []
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if marker in line:
            return "".join(out)
    raise AssertionError("scripts/sidecar did not finish:\n" + "".join(out[-60:]))


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.fresh
def test_scripts_sidecar_proves_isolation_in_front_of_vllm(tmp_path: Path, vllm_url: str) -> None:
    clone = fresh_clone(tmp_path)  # the script installs its own .venv, as for a new user
    port, admin = _free_port(), _free_port()
    env = user_env()
    command = ["bash", "scripts/sidecar", "--vllm-url", vllm_url, "--port", str(port)]
    command += ["--admin-port", str(admin), "--block-size", "128", "--tokenizer", str(MODEL_DIR)]
    proc = subprocess.Popen(
        command,
        cwd=clone,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output = _read_until(proc, READY, deadline_s=1200)  # a loaded host: installs, a probe
        assert "verdict: ISOLATED (exit 0)" in output, output
        assert "isolation:   PROVEN: kvfence probe says isolated" in output
        state = clone / ".kvfence" / "sidecar"
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        again = subprocess.run(
            ["bash", "scripts/sidecar", "check"], cwd=clone, env=env,
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert again.returncode == 0, again.stdout + again.stderr
        assert "verdict: ISOLATED (exit 0)" in again.stdout
        audit = re.search(r"^  audit log:   (.*)$", output, re.M)
        assert audit, output
        verified = subprocess.run(
            ["bash", "-c", audit.group(1)], cwd=clone, env=env,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert verified.returncode == 0, verified.stderr
        assert "ok: 2 of 2 chains intact" in verified.stdout
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        finally:
            if proc.stdout is not None:
                proc.stdout.close()
    for taken in (port, admin):  # Ctrl-C stopped the gateway
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", taken)) != 0, f"port {taken} still answers"
