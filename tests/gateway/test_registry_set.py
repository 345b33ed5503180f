"""`kvfence tenants set` as an operator uses it on a serving fleet (two workers, one state
directory): a registry tenant's models, budgets and limits change live, on every worker, with no
reload; a change the tenant reader refuses, or one to a tenant the policy file defines, is one
line and leaves the registry as it was; `tenants list` shows what each tenant spent against its
budgets when the gateway has a spend source."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.app import create_app
from gateway.policy.load import load_policy
from gateway.policy.registry_view import spent_text
from gateway.policy.reload import HOLDER
from gateway.server import bound_port, start, start_admin
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway import test_registry as base
from tests.gateway.test_registry import ADMIN, MSG, Fleet, cli, newest_document, registry_policy
from tests.kit.gateway import ENV, Gateway
from tests.kit.polling import until

fleet = base.fleet  # two workers on one state directory, the first with its admin listener


async def answer(gw: Gateway, key: str, model: str = "smollm2") -> tuple[int, str]:
    resp = await gw.session.post(
        gw.url + "/v1/chat/completions",
        json={"model": model, "messages": MSG},
        headers={"authorization": f"Bearer {key}"},
    )
    body = await resp.json()
    return resp.status, body["error"]["code"] if resp.status != 200 else ""


async def everywhere(fleet: Fleet, key: str, model: str, expected: tuple[int, str]) -> bool:
    return all([await answer(gw, key, model) == expected for gw in fleet.workers])


def online(fleet: Fleet) -> tuple[str, ...]:
    return ("--policy", str(fleet.policy), "--url", fleet.admin_url, "--token-env", "ADMIN")


async def test_a_changed_model_list_and_budget_apply_on_the_next_request_everywhere(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    await cli("tenants", "add", "team4", *online(fleet), capsys=capsys)
    _, out, _ = await cli("keys", "new", "--tenant", "team4", *online(fleet), "--json",
                          capsys=capsys)  # fmt: skip
    key = json.loads(out)["api_key"]
    await until(lambda: everywhere(fleet, key, "smollm2", (200, "")), what="team4 served")

    code, out, err = await cli("tenants", "set", "team4", "--model", "other", *online(fleet),
                               capsys=capsys)  # fmt: skip
    assert code == 0, err
    assert "tenant team4 changed (scope tenant, models other, limits none, budgets none)" in out
    await until(lambda: everywhere(fleet, key, "smollm2", (404, "model_not_found")),
                what="smollm2 refused to team4 on both workers")  # fmt: skip
    assert await answer(fleet.workers[1], key, "other") == (200, "")

    # The fake upstream's answers count 15 tokens: a day of 20 allows two requests.
    code, out, err = await cli("tenants", "set", "team4", "--model", "smollm2", "--budget",
                               "day=20", *online(fleet), capsys=capsys)  # fmt: skip
    assert code == 0 and "budgets day=20" in out, err
    first = fleet.workers[0]  # the admin's worker has the change at once
    assert [await answer(first, key) for _ in range(3)] == [
        (200, ""),
        (200, ""),
        (429, "budget_exceeded"),
    ]
    await until(lambda: everywhere(fleet, key, "smollm2", (429, "budget_exceeded")),
                what="the spent budget refused on both workers")  # fmt: skip

    code, out, err = await cli("tenants", "set", "team4", "--budget", "day=0", *online(fleet),
                               capsys=capsys)  # fmt: skip
    assert code == 0 and "budgets none" in out, err
    await until(lambda: everywhere(fleet, key, "smollm2", (200, "")), what="the budget removed")


async def test_limits_merge_and_clear_and_the_change_is_recorded(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = ("--policy", str(fleet.policy), "--offline")
    await cli("tenants", "add", "team6", "--limit", "requests_per_s=5", *policy, capsys=capsys)
    code, out, err = await cli("tenants", "set", "team6", "--limit", "concurrent=2", "--budget",
                               "hour=50", "--changed-by", "ops", *policy, "--json",
                               capsys=capsys)  # fmt: skip
    assert code == 0, err
    changed = json.loads(out)["changed"]
    assert changed["limits"] == {"requests_per_s": 5, "concurrent": 2}
    assert changed["budgets"] == {"hour": 50} and changed["changed_by"] == "ops"
    assert changed["changed"] >= changed["added"]
    code, out, _ = await cli("tenants", "set", "team6", "--limit", "requests_per_s=0",
                             *policy, "--json", capsys=capsys)  # fmt: skip
    changed = json.loads(out)["changed"]
    assert changed["limits"] == {"concurrent": 2} and "changed_by" not in changed
    code, out, _ = await cli("tenants", "set", "team6", "--clear-limits", "--no-budgets",
                             *policy, "--json", capsys=capsys)  # fmt: skip
    changed = json.loads(out)["changed"]
    assert "limits" not in changed and "budgets" not in changed
    assert changed["models"] == ["other", "smollm2"]  # what was not given stays


async def test_a_refused_change_leaves_the_tenant_as_it_was(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = ("--policy", str(fleet.policy), "--offline")
    await cli("tenants", "add", "team7", "--model", "smollm2", "--budget", "day=100", *policy,
              capsys=capsys)  # fmt: skip
    stored = fleet.policy.parent / "state" / "control.db"
    before = newest_document(stored)
    refusals = {
        ("team7", "--model", "nope"): "no backend serves model nope",
        ("team7", "--scope", "user", "--scope-header", "x-tenant-id"):
            "reserves for cache scoping",
        ("team7", "--scope", "request", "--scope-header", "x-end-user"):
            "scope request takes no scope header",
        ("team7", "--limit", "bogus=3"): "bogus",
        ("team7", "--budget", "week=3"): "use PERIOD=TOKENS",
        ("team7",): "nothing to change",
        ("acme", "--budget", "day=5"): "tenant acme is defined in the policy file: change it there",
        ("ghost", "--budget", "day=5"): "no tenant ghost in the registry",
    }  # fmt: skip
    for argv, message in refusals.items():
        code, _, err = await cli("tenants", "set", *argv, *policy, capsys=capsys)
        assert code == 2 and message in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert newest_document(stored) == before
    # Through the admin listener too (once the running gateway follows the offline add, within
    # its refresh): refused, and the tenant as it was.
    worker = fleet.workers[0].app[HOLDER]
    await until(lambda: any(t.id == "team7" for t in worker.runtime.registry.tenants), 10,
                "the running gateway follows the offline add")  # fmt: skip
    code, _, err = await cli("tenants", "set", "acme", "--model", "other", *online(fleet),
                             capsys=capsys)  # fmt: skip
    assert code == 2 and "defined in the policy file: change it there" in err
    code, out, _ = await cli("tenants", "list", *online(fleet), capsys=capsys)
    lines = {line.split()[0]: line.split() for line in out.splitlines()}
    assert lines["team7"][3:6] == ["smollm2", "0", "day=100"], (code, out, err)
    assert newest_document(stored) == before


def test_the_spent_column() -> None:
    budgets = {"id": "t", "budgets": {"hour": 1000, "day": 100000}}
    assert spent_text({**budgets, "spent": {"hour": 12, "day": 1234, "month": 9999}}) == (
        "hour=12/1000,day=1234/100000"
    )
    assert spent_text(budgets) == "-"  # no spend source
    assert spent_text({"id": "t", "spent": {"hour": 0, "day": 0, "month": 0}}) == "-"


@pytest.fixture
async def spending(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[Gateway, str]]:
    """One gateway whose app has a spend source, and its admin listener's URL."""
    for k, v in {**ENV, "ADMIN": ADMIN}.items():
        monkeypatch.setenv(k, v)
    (tmp_path / "state").mkdir(mode=0o700)
    path = tmp_path / "policy.yaml"
    path.write_text(registry_policy(upstream.url, tmp_path / "state").replace(
        "id: acme, ", "id: acme, budgets: {day: 100000}, "
    ))  # fmt: skip
    app = create_app(load_policy(path), state_dir=tmp_path / "state")  # spend: its ledger
    runner = await start(app, "127.0.0.1", 0)
    gw = Gateway(f"http://127.0.0.1:{bound_port(runner)}", upstream, app, aiohttp.ClientSession())
    admin = await start_admin(app, "127.0.0.1", 0)
    yield gw, f"http://127.0.0.1:{bound_port(admin)}"
    await admin.cleanup()
    await gw.session.close()
    await runner.cleanup()


async def test_tenants_list_shows_what_each_tenant_spent_against_its_budgets(
    spending: tuple[Gateway, str], capsys: pytest.CaptureFixture[str]
) -> None:
    gw, admin_url = spending
    for _ in range(2):
        assert (await gw.chat("acme", {"model": "smollm2", "messages": MSG})).status == 200
    where = ("--url", admin_url, "--token-env", "ADMIN")
    code, out, err = await cli("tenants", "list", *where, capsys=capsys)
    assert code == 0, err
    rows = {line.split()[0]: line.split() for line in out.splitlines()}
    assert rows["TENANT"][5:7] == ["BUDGETS", "SPENT"]
    assert rows["acme"][5:7] == ["day=100000", "day=30/100000"]  # 15 tokens an answer
    assert rows["globex"][5:7] == ["-", "-"]  # no budget: nothing counted against one
    _, out, _ = await cli("tenants", "list", *where, "--json", capsys=capsys)
    spent = {r["id"]: r.get("spent") for r in json.loads(out)["tenants"]}
    assert spent["acme"] == {"hour": 30, "day": 30, "month": 30}
