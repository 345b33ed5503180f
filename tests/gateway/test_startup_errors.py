"""Start-up errors a user can cause are one line on stderr naming the cause and the fix, with
no traceback: a busy port (gateway, admin listener, backend; with workers too), both listeners
on one port, an audit folder that does not exist."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kit.gateway import ENV, policy_text
from tests.kit.vllm_server import MODEL_DIR, await_build

URL = "http://127.0.0.1:9"


@pytest.fixture
def busy() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def _free() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kvfence.cli", *args],
        env={**os.environ, **ENV},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def _one_line(done: subprocess.CompletedProcess[str], code: int) -> str:
    assert done.returncode == code, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def _policy(tmp_path: Path, admin_port: int) -> Path:
    text = policy_text(URL)
    admin = "admin: {host: 127.0.0.1, port: 0}"
    assert admin in text
    path = tmp_path / "p.yaml"
    path.write_text(text.replace(admin, f"admin: {{host: 127.0.0.1, port: {admin_port}}}"))
    return path


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_busy_gateway_port_is_one_line(tmp_path: Path, busy: int, workers: str) -> None:
    policy = _policy(tmp_path, _free())
    done = _run("gateway", "--policy", str(policy), "--port", str(busy), "--workers", workers)
    line = _one_line(done, 2)
    assert f"127.0.0.1:{busy} is already in use, so the gateway cannot listen there" in line
    assert "--port or gateway.listen.port" in line


def test_a_busy_admin_port_is_one_line(tmp_path: Path, busy: int) -> None:
    policy = _policy(tmp_path, busy)
    line = _one_line(_run("gateway", "--policy", str(policy), "--port", str(_free())), 2)
    assert f"127.0.0.1:{busy} is already in use, so the admin listener cannot listen" in line
    assert "--admin-port or gateway.admin.port" in line


def test_both_listeners_on_one_port_is_one_line(tmp_path: Path) -> None:
    port = _free()
    policy = _policy(tmp_path, port)
    line = _one_line(_run("gateway", "--policy", str(policy), "--port", str(port)), 2)
    assert f"both want port {port}" in line


def test_a_busy_backend_port_is_one_line_before_the_model_loads(tmp_path: Path, busy: int) -> None:
    args = ("--trust", str(tmp_path / "t.json"), "--signing-key", str(tmp_path / "k.pem"))
    done = _run("backend", "--port", str(busy), *args)
    line = _one_line(done, 2)
    assert f"127.0.0.1:{busy} is already in use, so the backend cannot listen there" in line
    assert "ready to serve" not in done.stderr


def test_a_missing_audit_folder_stops_the_gateway_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "audit.key").write_text("k" * 32)
    audit = "access_log: false\n  audit_log: {path: logs/audit.jsonl, key: {file: audit.key}}"
    policy = _policy(tmp_path, _free())
    policy.write_text(policy.read_text().replace("access_log: false", audit))
    line = _one_line(_run("gateway", "--policy", str(policy), "--workers", "2"), 1)
    assert f"folder {tmp_path / 'logs'} does not exist: create it (mkdir -m 700)" in line


def _with_tokenizer(tmp_path: Path, folder: Path) -> Path:
    policy = _policy(tmp_path, _free())
    text = policy.read_text()
    assert "verify: {canary: false}" in text
    exact = f"verify: {{canary: false, detective: {{tokenizer: '{folder}'}}}}"
    policy.write_text(text.replace("verify: {canary: false}", exact))
    return policy


@pytest.mark.parametrize(
    ("files", "why"),
    [
        ({"tokenizer.json": "{not a tokenizer"}, "cannot load the tokenizer"),
        ({"chat_template.jinja": "{% for m in messages %}{{ m"}, "cannot load the chat template"),
    ],
)
def test_a_tokenizer_that_cannot_be_loaded_stops_the_gateway_with_one_line(
    tmp_path: Path, files: dict[str, str], why: str
) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    good = MODEL_DIR / "tokenizer.json"
    if "tokenizer.json" not in files:
        await_build()
        if not good.is_file():
            pytest.skip("no tokenizer directory here (made by scripts/vllm-env)")
        (folder / "tokenizer.json").write_bytes(good.read_bytes())
    for name, text in files.items():
        (folder / name).write_text(text)
    line = _one_line(_run("gateway", "--policy", str(_with_tokenizer(tmp_path, folder))), 2)
    assert line.startswith("kvfence gateway: refusing to start: backends[fake-vllm]"), line
    assert why in line and str(folder) in line
