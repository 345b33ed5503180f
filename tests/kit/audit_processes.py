"""The real gateway as processes, for the crash tests and bench/hardening.py: a policy with an
audit log (and, where the checkout has it, an anchor), launching, requests, and what the chains
hold. Nothing here imports code newer than the shape commit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, policy_text
from tests.kit.polling import until
from tests.kit.tamper import SECRET


def gateway_policy(tmp_path: Path, upstream: FakeUpstream, anchor: bool = True) -> Path:
    for folder in ("audit", "anchor"):
        (tmp_path / folder).mkdir(exist_ok=True)
    (tmp_path / "audit.key").write_bytes(SECRET)
    audit = "access_log: false\n  audit_log: {path: audit/audit.jsonl, key: {file: audit.key}" + (
        ", anchor: anchor/audit.anchor}" if anchor else "}"
    )
    path = tmp_path / "p.yaml"
    path.write_text(policy_text(upstream.url).replace("access_log: false", audit))
    return path


_LAUNCHED: list[asyncio.subprocess.Process] = []


def reap() -> None:
    """Kill every gateway `launch` started that still runs (a test that failed midway leaves
    its gateway behind otherwise), with its workers (each gateway is its own process group)."""
    while _LAUNCHED:
        proc = _LAUNCHED.pop()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def command(policy: Path, port: int, workers: int = 2) -> list[str]:
    return [sys.executable, "-m", "kvfence.cli", "gateway", "--policy", str(policy),
            "--port", str(port), "--workers", str(workers)]  # fmt: skip


async def launch(
    policy: Path, port: int, workers: int = 2
) -> tuple[asyncio.subprocess.Process, list[int]]:
    """Start a gateway (its own process group) and wait until every worker serves; its log
    goes to a file beside the policy."""
    logs = policy.with_name(f"gateway-{port}-{os.urandom(4).hex()}.log")
    with logs.open("wb") as out:
        proc = await asyncio.create_subprocess_exec(
            *command(policy, port, workers), env={**os.environ, **ENV},
            stdout=asyncio.subprocess.DEVNULL, stderr=out, start_new_session=True,
        )  # fmt: skip
    _LAUNCHED.append(proc)

    def serving() -> list[int]:
        found = [int(orjson.loads(line)["pid"]) for line in logs.read_bytes().splitlines()
                 if b'"msg":"serving"' in line]  # fmt: skip
        assert proc.returncode is None, logs.read_text()
        return found if len(found) == workers else []

    return proc, await until(serving, 60, what="the gateway serving")


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ", 1)[1][:1] == b"Z"
    except FileNotFoundError:
        return True


async def chat(port: int, rid: str) -> int:
    async with aiohttp.ClientSession() as http:
        resp = await http.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {KEYS['acme']}", "x-request-id": rid},
        )
        return resp.status


def records(tmp_path: Path) -> list[dict[str, Any]]:
    """Every record of every worker's chain (unverified)."""
    found = []
    for worker in (1, 2):
        path = tmp_path / "audit" / f"audit.w{worker}.jsonl"
        files = [*sorted(path.parent.glob(path.name + ".*[0-9]")), path]
        for file in (f for f in files if f.exists()):
            for line in file.read_bytes().splitlines():
                entry = orjson.loads(line) if line.endswith(b"}") else {}
                if entry.get("kind") == "record":
                    found.append(entry)
    return found
