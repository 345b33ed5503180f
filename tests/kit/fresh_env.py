"""What a new user starts from: a fresh clone of this repository and fresh virtual environments
made with the system's Python, never this suite's `.venv` (pip's own cache is shared, so an
install that downloaded once is quick). Used by the tests of the README's commands and of each
documented install."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def system_python() -> str:
    """The interpreter this suite's `.venv` was made from (the machine's own Python)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = Path(sys.base_prefix) / "bin" / version
    return str(base) if base.exists() else "python3"


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell: none of this suite's settings (no PYTHONPATH, no
    virtual environment on PATH, no KVFENCE_ switches)."""
    venv_bins = {str(ROOT / ".venv" / "bin"), str(Path(sys.prefix) / "bin")}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("KVFENCE_") and k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}
    }
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p not in venv_bins
    )
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env.update(extra)
    return env


def clone(tmp_path: Path) -> Path:
    """A `git clone` of this repository: what is committed, nothing installed or generated."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.fail("this test needs the project's git checkout and git")
    target = tmp_path / "kvfence"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    assert not (target / ".venv").exists()
    return target


def venv(path: Path, *installs: list[str]) -> Path:
    """A new virtual environment at `path`; each item of `installs` is one `pip install` (in
    order, as the README gives them). Returns its bin folder."""
    subprocess.run([system_python(), "-m", "venv", str(path)], check=True, env=user_env())
    for args in installs:
        done = subprocess.run(
            [str(path / "bin" / "python"), "-m", "pip", "install", "-q", *args],
            capture_output=True,
            text=True,
            env=user_env(),
            timeout=900,
        )
        assert done.returncode == 0, f"pip install {' '.join(args)}:\n{done.stderr[-3000:]}"
    return path / "bin"


def importable(bin_dir: Path, module: str) -> bool:
    probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(bin_dir / "python"), "-c", probe], env=user_env()).returncode == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[str], deadline_s: float, want: int = 200) -> None:
    """Poll `url` until it answers `want` (or the process exits, or the deadline passes)."""
    end = time.monotonic() + deadline_s
    last = "no answer"
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == want:
                    return
                last = str(resp.status)
        except urllib.error.HTTPError as exc:
            exc.close()  # an error answer holds its connection until closed
            if exc.code == want:
                return
            last = str(exc.code)
        except OSError as exc:
            last = str(exc)
        time.sleep(0.2)
    raise AssertionError(f"{url} did not answer {want} within {deadline_s:.0f} s (last: {last})")
