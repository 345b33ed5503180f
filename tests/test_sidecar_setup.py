"""scripts/sidecar's setup across runs: every tenant stays, whoever added it (an earlier run's
`--tenant`, `kvfence tenants add`), the ones asked for are added with a key file, none is
dropped; keys of a setup from before the registry keep working; the detective's block size is
the one the server reports."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from gateway.control.offline import OfflineRegistry
from gateway.policy.load import load_policy
from gateway.policy.runtime import Runtime
from kvfence.keys.apikey import mint_key

ROOT = Path(__file__).resolve().parents[1]


def setup(state: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "scripts/sidecar_setup.py", str(state), "--vllm-url", url,
               "--port", "18090", "--admin-port", "18091", *extra]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def runtime(state: Path) -> Runtime:
    policy = load_policy(state / "policy.yaml")
    return Runtime(policy, OfflineRegistry(policy).read())


@pytest.fixture
async def vllm_metrics() -> AsyncIterator[str]:
    """Stands in for vLLM's /metrics (what the setup asks): a 128-token block size."""

    async def metrics(_: web.Request) -> web.Response:
        info = 'vllm:cache_config_info{block_size="128",enable_prefix_caching="True"} 1.0\n'
        return web.Response(text="# HELP x\n" + info)

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


async def test_tenants_stay_across_runs_and_the_block_size_is_the_servers(
    tmp_path: Path, vllm_metrics: str
) -> None:
    state = tmp_path / "sidecar"
    first = await asyncio.to_thread(setup, state, vllm_metrics, "--tenant", "team5")
    assert first.returncode == 0, first.stderr
    assert "tenant team5 added" in first.stdout and "blocks of 128 tokens" in first.stdout
    assert "block_size: 128" in (state / "policy.yaml").read_text()
    keys = {t: (state / "keys" / t).read_text().strip() for t in ("acme", "globex", "team5")}
    assert oct((state / "keys" / "team5").stat().st_mode & 0o777) == "0o600"

    add = [sys.executable, "-m", "kvfence.cli", "tenants", "add", "team9", "--offline",
           "--policy", str(state / "policy.yaml")]  # fmt: skip
    added = await asyncio.to_thread(  # a tenant the script did not create
        subprocess.run, add, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert added.returncode == 0, added.stderr

    again = await asyncio.to_thread(
        setup, state, "http://127.0.0.1:9", "--block-size", "16"
    )  # no --tenant this time
    assert again.returncode == 0 and "added" not in again.stdout
    rt = runtime(state)
    assert {t.id for t in rt.tenants} == {"acme", "globex", "team5", "team9"}
    for tenant, key in keys.items():  # the same keys still open the same tenants
        found = rt.tenant_for_key(key)
        assert found is not None and found.id == tenant
    assert "block_size: 16" in (state / "policy.yaml").read_text()


def test_keys_of_a_setup_from_before_the_registry_keep_working(tmp_path: Path) -> None:
    state = tmp_path / "sidecar"
    (state / "secrets").mkdir(parents=True)
    (state / "secrets" / "pepper").write_text("p" * 43)
    old = {"acme": mint_key(), "globex": mint_key()}
    (state / "keys.json").write_text(json.dumps(old))
    done = setup(state, "http://127.0.0.1:9", "--block-size", "128")
    assert done.returncode == 0, done.stderr
    rt = runtime(state)
    for tenant, key in old.items():
        found = rt.tenant_for_key(key)
        assert found is not None and found.id == tenant
        assert (state / "keys" / tenant).read_text().strip() == key
    assert not (state / "keys.json").exists()


def namespace_keys(state: Path) -> dict[str, tuple[bytes, bool]]:
    policy = load_policy(state / "policy.yaml")
    return {k.id: (k.secret.value, k.active) for k in policy.gateway.namespace_keys}


def test_a_rotated_namespace_key_stays_across_runs(tmp_path: Path) -> None:
    state = tmp_path / "sidecar"
    assert setup(state, "http://127.0.0.1:9", "--block-size", "128").returncode == 0
    first = namespace_keys(state)
    assert list(first) == ["ns1"] and first["ns1"][1]

    rotate = [sys.executable, "scripts/sidecar_setup.py", str(state), "--rotate-namespace-key"]
    done = subprocess.run(rotate, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "namespace key ns2 is active" in done.stdout and "starts cold" in done.stdout
    rotated = namespace_keys(state)
    assert rotated["ns1"] == (first["ns1"][0], False)  # the old key kept, for verification
    assert rotated["ns2"][1] and rotated["ns2"][0] != first["ns1"][0]
    assert oct((state / "secrets" / "namespace-key-ns2").stat().st_mode & 0o777) == "0o600"

    for _ in range(2):  # later runs, other ports: the rotation and both secrets stay
        again = setup(state, "http://127.0.0.1:9", "--block-size", "16", "--tenant", "team5")
        assert again.returncode == 0, again.stderr
        assert namespace_keys(state) == rotated
        assert load_policy(state / "policy.yaml").gateway.active_key.id == "ns2"
    assert "block_size: 16" in (state / "policy.yaml").read_text()


def test_namespace_keys_rotated_by_hand_stay_across_runs(tmp_path: Path) -> None:
    state = tmp_path / "sidecar"
    assert setup(state, "http://127.0.0.1:9", "--block-size", "128").returncode == 0
    (state / "secrets" / "ns-new").write_text("n" * 44)
    (state / "secrets" / "ns-new").chmod(0o600)
    text = (state / "policy.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("  namespace_keys:"))
    edited = text.replace(line, "  namespace_keys:\n"
                          "    - {id: ns1, secret: {file: secrets/namespace-key}}\n"
                          "    - id: fresh\n      secret: {file: secrets/ns-new}\n"
                          "      active: true")  # fmt: skip
    (state / "policy.yaml").write_text(edited)
    before = namespace_keys(state)
    assert setup(state, "http://127.0.0.1:9", "--block-size", "128").returncode == 0
    assert namespace_keys(state) == before and before["fresh"] == (b"n" * 44, True)
