"""A real `redis-server` on a free loopback port, for tests and bench/fleet_routing.py: nothing
persisted, stopped (and restartable on the same port) on demand."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

REDIS = shutil.which("redis-server")
ROOT = Path(__file__).resolve().parents[2]
GATEWAY_USER = "kvfence-gateway"


def deployed_rules() -> str:
    """The gateways' ACL user's rules as deploy/compose.fleet.yml writes them (tests/test_deploy.py
    holds deploy/k8s and docs/fleet.md to the same line)."""
    compose = yaml.safe_load((ROOT / "deploy" / "compose.fleet.yml").read_text())
    words = " ".join(compose["services"]["redis"]["command"][2].split())
    found = re.search(rf"user {GATEWAY_USER} on >%s (.*?)\\n'", words)
    assert found is not None, "no ACL line for the gateways' user in deploy/compose.fleet.yml"
    return found.group(1)


GATEWAY_RULES = deployed_rules()


def gateway_acl(password: str) -> tuple[str, ...]:
    """redis-server options for the deployed ACL: the default user off, the gateways' user."""
    return ("--user", "default", "off", "resetpass", "-@all",
            "--user", GATEWAY_USER, "on", f">{password}", *GATEWAY_RULES.split())  # fmt: skip


def need_redis() -> None:
    """Skip without redis-server, or fail where it is required (scripts/test installs it and
    sets KVFENCE_REQUIRE_REDIS=1, so CI cannot pass with the fleet tests skipped)."""
    if REDIS is not None:
        return
    if os.environ.get("KVFENCE_REQUIRE_REDIS") == "1":
        pytest.fail("KVFENCE_REQUIRE_REDIS=1 but redis-server is not installed", pytrace=False)
    pytest.skip("redis-server is not installed (scripts/test installs it with apt-get)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
    except OSError:
        return False


class RedisServer:
    """`args`: more options for redis-server (an ACL user, say)."""

    def __init__(self, folder: Path, args: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.port = free_port()
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS is not None
        command = [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(self.folder), *self.args]  # fmt: skip
        log = (self.folder / "redis.log").open("ab")
        self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 10
        while not _answers(self.port):
            assert self.proc.poll() is None, (self.folder / "redis.log").read_text()
            assert time.monotonic() < deadline, "redis-server did not answer within 10 s"
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None
