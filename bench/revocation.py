"""How soon a revoked registry key is refused by every worker: a `kvfence gateway --workers 2`
process on a policy with `registry: true` (a fake upstream behind it), a key minted and served,
then revoked in the registry file (as `kvfence keys revoke --offline` does) while requests on
fresh connections (so both workers answer) keep coming; the figure is the time from the change
to the last request that was still served. Prints the figures and writes
bench/results/revocation.json.

    .venv/bin/python -m bench.revocation [--trials 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from bench.machine import describe
from gateway.control.offline import OfflineRegistry
from gateway.policy import registry as reg
from kvfence.keys.apikey import key_digest, mint_key
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fresh_env import free_port
from tests.kit.polling import until

ROOT = Path(__file__).resolve().parents[1]
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}


def _policy(folder: Path, upstream: str, port: int) -> Path:
    for name in ("ns", "pepper"):
        (folder / name).write_text(secrets.token_urlsafe(32))
    path = folder / "policy.yaml"
    path.write_text(f"""version: 1
gateway:
  listen: {{host: 127.0.0.1, port: {port}}}
  admin: {{host: 127.0.0.1, port: {free_port()}}}
  state_dir: state
  access_log: false
  namespace_keys: [{{id: ns1, secret: {{file: ns}}, active: true}}]
  api_key_pepper: {{file: pepper}}
backends:
  - {{name: fake, kind: vllm, url: "{upstream}", verify: {{canary: false}},
      models: [{{name: smollm2, revision: "1"}}]}}
registry: true
tenants: [{{id: acme, api_keys: [], scope: tenant, models: [smollm2]}}]
""")
    return path


async def _status(url: str, key: str) -> int:
    connector = aiohttp.TCPConnector(force_close=True)  # a fresh connection: any worker
    headers = {"authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.post(url, json=CHAT, headers=headers) as resp,
    ):
        return resp.status


async def _answers(url: str, key: str, status: int) -> bool:
    try:
        return await _status(url, key) == status
    except aiohttp.ClientError:
        return False


async def _trial(url: str, store: OfflineRegistry, pepper: bytes) -> float:
    key = mint_key()
    digest = key_digest(pepper, key)
    store.update(lambda doc: reg.new_key(doc, "acme", digest, known=["acme"]))
    await until(lambda: _answers(url, key, 200), timeout_s=30, what="the new key served")
    changed = time.monotonic()
    store.update(lambda doc: reg.revoke_key(doc, reg.key_id(digest)))
    last_served, refused_in_a_row = 0.0, 0
    while refused_in_a_row < 40:  # 40 refusals in a row on fresh connections: every worker
        status = await _status(url, key)
        if status == 200:
            last_served, refused_in_a_row = time.monotonic() - changed, 0
        else:
            refused_in_a_row += 1
    return last_served


async def run(trials: int) -> dict[str, object]:
    upstream = FakeUpstream()
    await upstream.start()
    with tempfile.TemporaryDirectory(prefix="kvfence-revocation-") as tmp:
        folder, port = Path(tmp), free_port()
        policy = _policy(folder, upstream.url, port)
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        command = [sys.executable, "-m", "kvfence.cli", "gateway", "--policy", str(policy)]
        proc = await asyncio.create_subprocess_exec(
            *command, "--workers", "2", env=env, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            await until(lambda: _answers(url, mint_key(), 401), timeout_s=60, what="started")
            pepper = (folder / "pepper").read_bytes()
            store = OfflineRegistry(state_dir=folder / "state", pepper=pepper)
            times = [await _trial(url, store, pepper) for _ in range(trials)]
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            await asyncio.wait_for(proc.wait(), timeout=30)
    await upstream.close()
    ms = sorted(round(t * 1000, 1) for t in times)
    return {
        "machine": describe(),
        "workers": 2,
        "trials": trials,
        "last_served_after_revoke_ms": ms,
        "median_ms": statistics.median(ms),
        "max_ms": ms[-1],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=10)
    args = parser.parse_args()
    result = asyncio.run(run(args.trials))
    print(f"revoked key last served {result['median_ms']} ms (median), {result['max_ms']} ms "
          f"(max) after the change, over {args.trials} trials, 2 workers")  # fmt: skip
    out = ROOT / "bench" / "results" / "revocation.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
