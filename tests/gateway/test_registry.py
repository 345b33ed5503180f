"""The tenant registry as an operator uses it: `kvfence tenants` and `kvfence keys` add a tenant,
mint, list, revoke and expire its keys, offline against the registry file and online through the
admin listener, while gateways (two apps on one state directory, as two workers) serve; no
policy edit, no reload. A revoked or expired key is refused with a message saying so, on every
worker; registry routes need the admin token; a registry entry the policy cannot serve is left
out with its reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.policy.load import load_policy
from gateway.server import bound_port, start_admin
from kvfence.cli import main as kvfence_main
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, policy_text, run_gateway
from tests.kit.polling import until

MSG = [{"role": "user", "content": "hi"}]
ADMIN = "admin-token-0123456789abcdef"


def registry_policy(url: str, state: Path) -> str:
    text = policy_text(url).replace(
        "admin: {host: 127.0.0.1, port: 0}",
        f"admin: {{host: 127.0.0.1, port: 0, token: {{env: ADMIN}}}}\n  state_dir: {state}",
    )
    return text + "registry: true\n"


@dataclass
class Fleet:
    policy: Path
    workers: list[Gateway]
    admin_url: str


@pytest.fixture
async def fleet(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Fleet]:
    for k, v in {**ENV, "ADMIN": ADMIN}.items():
        monkeypatch.setenv(k, v)
    path = tmp_path / "policy.yaml"
    path.write_text(registry_policy(upstream.url, tmp_path / "state"))
    (tmp_path / "state").mkdir(mode=0o700)
    started = [
        await run_gateway(load_policy(path), upstream, state_dir=tmp_path / "state")
        for _ in range(2)
    ]
    admin = await start_admin(started[0][0].app, "127.0.0.1", 0)
    yield Fleet(path, [g for g, _ in started], f"http://127.0.0.1:{bound_port(admin)}")
    await admin.cleanup()
    for gw, runner in started:
        await gw.session.close()
        await runner.cleanup()


async def cli(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run `kvfence ARGV` as a person would (in a thread: it blocks on the admin listener)."""
    code = await asyncio.to_thread(kvfence_main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def status(gw: Gateway, key: str) -> tuple[int, str]:
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions",
        json={"model": "smollm2", "messages": MSG},
        headers={"authorization": f"Bearer {key}"},
    )
    body = await resp.json()
    return resp.status, body["error"]["message"] if resp.status != 200 else ""


async def everywhere(fleet: Fleet, key: str, expected: int) -> bool:
    return all([(await status(gw, key))[0] == expected for gw in fleet.workers])


async def test_a_tenant_added_and_keyed_offline_is_served_then_revoked_everywhere(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = str(fleet.policy)
    code, out, _ = await cli(
        "tenants", "add", "team3", "--policy", policy, "--offline", capsys=capsys
    )
    assert code == 0 and "tenant team3 added (scope tenant, models other, smollm2)" in out
    code, out, err = await cli(
        "keys", "new", "--tenant", "team3", "--label", "ci", "--policy", policy,
        "--offline", "--json", capsys=capsys,
    )  # fmt: skip
    assert code == 0, err
    minted = json.loads(out)
    key = minted["api_key"]
    stored = fleet.policy.parent / "state" / "control.db"
    assert "team3" in newest_document(stored) and key not in newest_document(stored)
    assert oct(stored.stat().st_mode & 0o777) == "0o600"
    await until(lambda: everywhere(fleet, key, 200), what="both workers serve the new key")

    code, out, _ = await cli("keys", "list", "--policy", policy, "--offline", capsys=capsys)
    assert minted["id"] in out and "team3" in out and "active" in out and key not in out
    code, out, _ = await cli("keys", "revoke", minted["id"], "--policy", policy, "--offline",
                             capsys=capsys)  # fmt: skip
    assert code == 0 and f"key {minted['id']} of tenant team3 revoked" in out
    await until(lambda: everywhere(fleet, key, 401), what="both workers refuse the revoked key")
    assert await status(fleet.workers[1], key) == (
        401,
        "this API key was revoked: ask for a new one",
    )
    code, out, _ = await cli("keys", "list", "--policy", policy, "--offline", capsys=capsys)
    assert "revoked" in out


async def test_online_through_the_admin_listener(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    online = ("--policy", str(fleet.policy), "--url", fleet.admin_url, "--token-env", "ADMIN")
    code, out, err = await cli("tenants", "add", "team4", "--model", "smollm2", "--budget",
                               "day=5000", *online, capsys=capsys)  # fmt: skip
    assert code == 0, err
    assert f"through the gateway at {fleet.admin_url}" in err
    code, out, err = await cli("keys", "new", "--tenant", "team4", "--expires", "30d", *online,
                               "--json", capsys=capsys)  # fmt: skip
    minted = json.loads(out)
    assert code == 0 and minted["tenant"] == "team4" and minted["expires"] is not None
    key = minted["api_key"]
    assert await status(fleet.workers[0], key) == (200, "")  # the admin's worker: at once
    await until(lambda: everywhere(fleet, key, 200), what="the other worker serves it")

    code, out, _ = await cli("tenants", "list", *online, capsys=capsys)
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "day=5000" in lines["team4"] and "registry" in lines["team4"]
    assert "policy" in lines["acme"]

    code, out, _ = await cli("keys", "expire", minted["id"][:10], "--at", "now", *online,
                             capsys=capsys)  # fmt: skip
    assert code == 0 and f"key {minted['id']} of tenant team4 expires" in out
    await until(lambda: everywhere(fleet, key, 401), what="the expired key refused")
    assert (await status(fleet.workers[1], key))[1] == "this API key has expired: ask for a new one"

    code, out, _ = await cli("tenants", "remove", "team4", *online, capsys=capsys)
    assert code == 0 and "tenant team4 removed with its 1 keys" in out
    code, _, err = await cli("tenants", "remove", "acme", *online, capsys=capsys)
    assert code == 2 and "defined in the policy file" in err


async def test_a_registry_key_for_a_policy_tenant_and_the_refusals(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = str(fleet.policy)
    code, out, _ = await cli("keys", "new", "--tenant", "acme", "--policy", policy, "--offline",
                             "--json", capsys=capsys)  # fmt: skip
    key = json.loads(out)["api_key"]
    await until(lambda: everywhere(fleet, key, 200), what="acme's registry key works")
    refusals = {
        ("tenants", "add", "acme"): "tenant acme is defined in the policy file",
        ("tenants", "add", "x", "--model", "nope"): "no backend serves model nope",
        ("tenants", "add", "x", "--scope", "user", "--scope-header", "x-tenant-id"):
            "reserves for cache scoping",
        ("keys", "new", "--tenant", "ghost"): "no tenant ghost: add it first",
        ("keys", "revoke", "key_000000000000"): "no key key_000000000000",
        ("tenants", "add", "x", "--budget", "week=3"): "use PERIOD=TOKENS",
    }  # fmt: skip
    for argv, message in refusals.items():
        code, _, err = await cli(*argv, "--policy", policy, "--offline", capsys=capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)


async def test_registry_routes_need_the_admin_token(fleet: Fleet) -> None:
    session = fleet.workers[0].session
    for method, path in (("GET", "/tenants"), ("GET", "/keys"), ("POST", "/keys")):
        resp = await session.request(method, fleet.admin_url + path)
        assert resp.status == 401, path
        bad = {"authorization": "Bearer " + "x" * 30}
        assert (await session.request(method, fleet.admin_url + path, headers=bad)).status == 401


async def test_a_registry_tenant_the_policy_no_longer_serves_is_left_out(
    fleet: Fleet, upstream: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = str(fleet.policy)
    await cli("tenants", "add", "team5", "--model", "other", "--policy", policy, "--offline",
              capsys=capsys)  # fmt: skip
    _, out, _ = await cli("keys", "new", "--tenant", "team5", "--policy", policy, "--offline",
                             "--json", capsys=capsys)  # fmt: skip
    key = json.loads(out)["api_key"]
    await until(lambda: everywhere(fleet, key, 404), what="team5 known (it may not use smollm2)")
    # The same state under a policy whose backend serves smollm2 only: team5 is left out.
    text = fleet.policy.read_text().replace(', {name: other, revision: "2"}', "")
    text = text.replace("models: [smollm2, other]", "models: [smollm2]")
    narrow = tmp_path / "narrow.yaml"
    narrow.write_text(text)
    gw, runner = await run_gateway(load_policy(narrow), upstream, state_dir=tmp_path / "state")
    try:
        assert (await status(gw, key))[0] == 401
        _, out, err = await cli("tenants", "list", "--policy", str(narrow), "--offline",
                                   capsys=capsys)  # fmt: skip
        assert "team5" not in out
        assert "left out: registry tenant team5:1: models[0]: no backend serves model other" in err
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_a_relative_policy_path_names_the_same_registry(
    fleet: Fleet, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = fleet.policy.parent
    text = fleet.policy.read_text().replace(f"state_dir: {folder / 'state'}", "state_dir: state")
    (folder / "relative.yaml").write_text(text)
    monkeypatch.chdir(folder.parent)
    relative = f"{folder.name}/relative.yaml"
    code, _, err = await cli("tenants", "add", "team7", "--policy", relative, "--offline",
                             capsys=capsys)  # fmt: skip
    assert code == 0 and f"offline, in the control database {folder.name}/state/control.db" in err
    assert "team7" in newest_document(folder / "state" / "control.db")


def newest_document(db: Path) -> str:
    """The newest registry version's document in a gateway's SQLite control database."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT document FROM registry_versions ORDER BY version DESC LIMIT 1")
        return str(row.fetchone()[0])
