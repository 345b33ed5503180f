"""The gateway in front of our backend, as users run them: a `kvfence backend` process and a
`kvfence gateway` process (audit log on, fsync always) on a generated policy with throwaway
keys; N concurrent streams through the gateway against N straight to the backend, isolation
through the gateway, and `kvfence audit verify` on the log it wrote.

Invariant: both legs of a round send the same fresh prompts (each leg its own namespace, so
both miss) in alternating order, to the same backend process; every process started here is
stopped when its block ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp

from bench.backend_throughput import make_prompt, stream_once
from bench.gpu.summary import gateway_cost
from bench.targets import REPO_ROOT, Target
from kvfence.handle import HANDLE_HEADER, HandleSigner
from kvfence.keys.keyfile import load_private_key
from tests.kit.gateway_process import gateway_process
from tests.kit.stack import AUDIENCE, Keys, make_keys, write_policy
from tests.kit.vllm_server import free_port, running_server

MODEL = "smollm2"
Progress = Callable[[str], None]


def _env() -> dict[str, str]:
    """This environment with the checkout first on the path (the `kvfence` script beside the
    interpreter may belong to another checkout)."""
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


@contextmanager
def backend_process(keys: Keys, model: str, device: str, dtype: str, streams: int) -> Iterator[str]:
    """`kvfence backend` with the in-process engine's batch limits; yields its URL."""
    port = free_port()
    command = [sys.executable, "-m", "kvfence.cli", "backend", "--model", model,
               "--served-name", MODEL, "--id", AUDIENCE, "--port", str(port),
               "--trust", str(keys.folder / "backend-trust.json"),
               "--signing-key", str(keys.folder / "be.key"), "--device", device, "--dtype", dtype,
               "--kv-blocks", "8192", "--max-num-seqs", str(max(streams, 64)),
               "--max-step-tokens", "8192", "--log-level", "warning"]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with running_server(command, f"{url}/healthz", _env(), 300.0):
        yield url


def direct_target(keys: Keys, url: str) -> Target:
    """Straight to the backend: each request carries a handle the gateway's key signs, for a
    namespace of this round alone."""
    signer = HandleSigner(load_private_key(keys.folder / "gateway.key"), "gateway")
    namespace = "direct." + secrets.token_hex(8)

    def handle(body: bytes) -> Mapping[str, str]:
        return {
            HANDLE_HEADER: signer.sign(namespace, MODEL, "1", uuid.uuid4().hex, AUDIENCE, body=body)
        }

    return Target("direct", url, MODEL, headers=handle)


def gateway_target(keys: Keys, url: str, tenant: str) -> Target:
    bearer = {"authorization": f"Bearer {keys.api_keys[tenant]}"}
    return Target(f"gateway-{tenant}", url, MODEL, headers=lambda _body: bearer)


def gateway_policy(keys: Keys, backend_url: str, workers: int) -> Path:
    """The stack policy on fixed free ports, with this worker count's own audit log."""
    audit = (
        f"  audit_log: {{path: audit-w{workers}.jsonl, key: {{file: audit.key}}, fsync: always}}\n"
    )
    path = write_policy(keys, backend_url, MODEL, audit_log=audit)
    ports = f"  listen: {{host: 127.0.0.1, port: {free_port()}}}\n"
    ports += f"  admin: {{host: 127.0.0.1, port: {free_port()}}}\n"
    target = path.with_name(f"policy-w{workers}.yaml")
    target.write_text(path.read_text().replace("gateway:\n", "gateway:\n" + ports, 1))
    return target


def listen_url(policy: Path) -> str:
    line = next(x for x in policy.read_text().splitlines() if x.strip().startswith("listen:"))
    return f"http://127.0.0.1:{line.rsplit('port:', 1)[1].strip(' }')}"


async def leg(
    http: aiohttp.ClientSession, target: Target, prompts: list[str], max_tokens: int
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    samples = await asyncio.gather(*(stream_once(http, target, p, max_tokens) for p in prompts))
    seconds = loop.time() - start
    tokens = sum(s.tokens for s in samples)
    return {
        "tokens": tokens,
        "cached_tokens": sum(s.cached_tokens or 0 for s in samples),
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1),
    }


async def compare(
    keys: Keys, backend_url: str, gateway_url: str, args: Any, progress: Progress
) -> dict[str, Any]:
    """Rounds of N streams direct and through the gateway, alternating which goes first. Each
    leg keeps one namespace for all rounds and is warmed first, so both hold the chat template's
    shared first block and miss on the rest."""
    gateway = gateway_target(keys, gateway_url, "acme")
    order = [("direct", direct_target(keys, backend_url)), ("gateway", gateway)]
    rounds = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        for _, target in order:
            warm = [make_prompt(args.prompt_words) for _ in range(args.gateway_streams)]
            await leg(http, target, warm, 4)
        for i in range(args.gateway_rounds):
            prompts = [make_prompt(args.prompt_words) for _ in range(args.gateway_streams)]
            found: dict[str, Any] = {}
            for name, target in order if i % 2 == 0 else order[::-1]:
                found[name] = await leg(http, target, prompts, args.max_tokens)
            rounds.append(found)
            progress(f"round {i + 1}: direct {found['direct']['tokens_per_s']} tok/s, "
                     f"gateway {found['gateway']['tokens_per_s']} tok/s")  # fmt: skip
        isolation = await isolation_check(http, keys, gateway_url, args.prompt_words)
    direct = statistics.median(r["direct"]["tokens_per_s"] for r in rounds)
    through = statistics.median(r["gateway"]["tokens_per_s"] for r in rounds)
    return {
        "streams": args.gateway_streams,
        "direct_tokens_per_s": direct,
        "gateway_tokens_per_s": through,
        "gateway_cost": gateway_cost(direct, through),
        "rounds": rounds,
        "isolation": isolation,
    }


async def cached_tokens(
    http: aiohttp.ClientSession, target: Target, messages: list[dict[str, str]]
) -> int | None:
    """One 1-token answer; the prompt tokens its usage says came from the cache."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}
    data = json.dumps(body).encode()
    headers = {"content-type": "application/json", **target.headers(data)}
    async with http.post(f"{target.base_url}/v1/chat/completions", data=data, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{target.name}: HTTP {r.status}: {(await r.text())[:300]}")
        usage = (await r.json()).get("usage") or {}
    found = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    return None if found is None else int(found)


async def isolation_check(
    http: aiohttp.ClientSession, keys: Keys, url: str, words: int
) -> dict[str, Any]:
    """One prompt, its system message led by a nonce (so no block is shared with earlier
    traffic): acme twice (the repeat hits), then globex (must get nothing cached)."""
    messages = [
        {"role": "system", "content": secrets.token_hex(8) + " You are a helpful assistant."},
        {"role": "user", "content": make_prompt(words)},
    ]
    acme, globex = gateway_target(keys, url, "acme"), gateway_target(keys, url, "globex")
    found: dict[str, Any] = {"a_first": await cached_tokens(http, acme, messages)}
    found["a_repeat"] = await cached_tokens(http, acme, messages)
    found["b_same_prompt"] = await cached_tokens(http, globex, messages)
    found["ok"] = found["a_first"] == 0 and (found["a_repeat"] or 0) > 0
    found["ok"] = found["ok"] and found["b_same_prompt"] == 0
    return found


def verify_audit(policy: Path, workers: int) -> dict[str, Any]:
    """`kvfence audit verify` as an operator runs it, on the stopped gateway's log."""
    command = [sys.executable, "-m", "kvfence.cli", "audit", "verify", "--policy", str(policy),
               "--workers", str(workers)]  # fmt: skip
    done = subprocess.run(command, env=_env(), cwd=policy.parent, capture_output=True, text=True)
    said = (done.stdout + done.stderr).strip().splitlines()
    return {
        "workers": workers,
        "exit_code": done.returncode,
        "ok": done.returncode == 0,
        "output": said[-6:],
    }


def run(args: Any, model: str, progress: Progress) -> dict[str, Any]:
    """The whole section: one backend, then a gateway per worker count in front of it."""
    rows, audits = [], []
    with tempfile.TemporaryDirectory(prefix="kvfence-gpu-check-") as tmp:
        keys = make_keys(Path(tmp))
        progress("starting kvfence backend")
        with backend_process(keys, model, args.device, args.dtype, args.gateway_streams) as backend:
            for workers in args.workers:
                policy = gateway_policy(keys, backend, workers)
                progress(f"kvfence gateway --workers {workers}, {args.gateway_streams} streams")
                with gateway_process(policy, listen_url(policy), workers, _env()):
                    found = asyncio.run(compare(keys, backend, listen_url(policy), args, progress))
                rows.append({"workers": workers, **found})
                audits.append(verify_audit(policy, workers))
    return {"rows": rows, "audit": audits}
