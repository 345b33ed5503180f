"""`scripts/up` from a fresh clone in a user's environment (the machine's Python, none of this
suite's settings): it installs its own `.venv`, both services become healthy, and the curl
example it prints, and the README's, work as written; a busy port is named before anything is
installed."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.kit.fresh_env import clone as _clone
from tests.kit.fresh_env import free_port as _free_port
from tests.kit.fresh_env import user_env as _env

READY_LINE = "Ctrl-C stops both"


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
    raise AssertionError("scripts/up did not report ready:\n" + "".join(out[-40:]))


def _printed_openai(output: str) -> str:
    match = re.search(r"^  (\.venv/bin/python - <<'PY'\n.*?\nPY)$", output, re.S | re.M)
    assert match, output
    return match.group(1)


def _printed_curl(output: str) -> str:
    match = re.search(r"^  (curl .*?'\n)", output, re.S | re.M)
    assert match, output
    return match.group(1)


def test_scripts_up_names_a_busy_port_before_starting_anything(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.Popen(
            ["bash", "scripts/up", "--backend-port", str(port), "--port", str(_free_port()),
             "--admin-port", str(_free_port())],
            cwd=clone, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=120)
        finally:  # whatever it started goes too, should it have started anything
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"127.0.0.1:{port} is already in use" in line
    assert "choose another: scripts/up --backend-port N" in line
    assert "starting" not in done.stdout and not (clone / ".kvfence" / "logs").exists()
    assert not (clone / ".venv").exists()  # nothing installed for a run that cannot start


def _readme_commands(clone: Path, port: int) -> str:
    """The README's first console example (the commands before its output), for this port."""
    text = (clone / "README.md").read_text()
    block = text[text.index("```console\n$ ") + len("```console\n") :]
    commands = block[: block.index("\nHTTP/1.1 ")]
    assert "ACME_KEY=$(" in commands, commands
    return re.sub(r"^\$ ", "", commands, flags=re.M).replace(":8080/", f":{port}/")


@pytest.mark.slow
@pytest.mark.fresh
def test_scripts_up_from_a_fresh_clone(tmp_path: Path) -> None:
    clone = _clone(tmp_path)
    ports = {"--port": _free_port(), "--admin-port": _free_port(), "--backend-port": _free_port()}
    proc = subprocess.Popen(
        ["bash", "scripts/up", *[arg for k, v in ports.items() for arg in (k, str(v))]],
        cwd=clone,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output = _read_until(proc, READY_LINE, deadline_s=900)  # installs .venv first
        state = clone / ".kvfence"
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        assert oct((state / "demo.json").stat().st_mode & 0o777) == "0o600"
        curl = _printed_curl(output)
        assert f"http://127.0.0.1:{ports['--port']}/v1/chat/completions" in curl
        admin = f"http://127.0.0.1:{ports['--admin-port']}/status"
        with pytest.raises(urllib.error.HTTPError) as refused:  # not for any local process
            urllib.request.urlopen(admin, timeout=10)
        refused.value.close()  # the refusal holds its connection until closed
        assert refused.value.code == 401
        token = (state / "secrets" / "admin-token").read_text().strip()
        request = urllib.request.Request(admin, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=10) as resp:
            assert json.loads(resp.read())["ready"] is True
        assert oct((state / "api-keys" / "acme").stat().st_mode & 0o777) == "0o600"
        readme = _readme_commands(clone, ports["--port"])
        for command in (curl, readme):  # what it printed, and what the README shows
            answer = subprocess.run(
                ["bash", "-c", command], cwd=clone, capture_output=True, text=True, timeout=120,
                check=True,
            ).stdout  # fmt: skip
            assert answer.startswith("HTTP/1.1 200"), answer
            assert re.search(r"^x-kvfence-verdict: clean\r?$", answer, re.M | re.I), answer
            assert "Paris" in answer
        example = subprocess.run(  # the openai client example, in the .venv it names
            ["bash", "-c", _printed_openai(output)], cwd=clone, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert example.returncode == 0 and "Paris" in example.stdout, example.stderr
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
    for port in ports.values():  # Ctrl-C stopped both servers, and they were on these ports
        with socket.socket() as sock:
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still answers"
