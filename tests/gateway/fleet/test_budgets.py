"""Token budgets per tenant and per registry key, over calendar periods: a budget spent is a 429
`budget_exceeded` naming the period and when it renews, until then; other tenants and keys are
untouched; spend is kept in the control database, so workers (SQLite in one state directory) and
replicas (PostgreSQL) share it, and no restart of a gateway or of Redis renews it."""

from __future__ import annotations

import calendar
from pathlib import Path

import pytest

from gateway.control.offline import OfflineRegistry
from gateway.fleet.windows import window
from gateway.policy import registry as reg
from gateway.policy.load import parse_policy
from kvfence.keys.apikey import key_digest, mint_key
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.fleet_policies import fleet_policy_text, replica
from tests.kit.gateway import ENV, PEPPER, Gateway, policy_text, run_gateway
from tests.kit.postgres_server import PASSWORD, PostgresServer
from tests.kit.redis_server import RedisServer

CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
# The fake upstream's answers report 15 tokens (12 prompt + 3 completion).


def test_windows_are_utc_calendar_periods() -> None:
    now = calendar.timegm((2026, 12, 31, 23, 59, 30))
    assert window("hour", now) == (now - 3570, now + 30)
    assert window("day", now) == (now - 86370, now + 30)
    assert window("month", now) == (calendar.timegm((2026, 12, 1, 0, 0, 0)), now + 30)


async def status(gw: Gateway, tenant: str = "acme") -> tuple[int, str, str]:
    resp = await gw.chat(tenant, CHAT)
    body = await resp.json()
    code = body["error"]["code"] if resp.status != 200 else ""
    message = body["error"]["message"] if resp.status != 200 else ""
    return resp.status, code, message + resp.headers.get("retry-after", "")


async def test_a_spent_tenant_budget_is_refused_until_it_renews(
    upstream: FakeUpstream, tmp_path: Path
) -> None:
    text = policy_text(upstream.url).replace(
        "id: acme, ", "id: acme, budgets: {hour: 1000, day: 20}, "
    )
    policy = parse_policy(text, "t.yaml", env=ENV)
    workers = [await run_gateway(policy, upstream, state_dir=tmp_path) for _ in range(2)]
    (one, _), (two, _) = workers
    try:
        assert (await status(one))[0] == 200  # 15 of 20
        assert (await status(two))[0] == 200  # 30: the other worker saw the first charge
        code, error, message = await status(one)
        assert (code, error) == (429, "budget_exceeded")
        assert "this tenant's daily token budget (20) is spent; it renews at" in message
        assert len(upstream.received) == 2  # the refused request cost the upstream nothing
        assert (await status(two))[0] == 429
        assert (await status(one, "globex"))[0] == 200  # other tenants are untouched
        metrics = await one.metrics()
        assert (
            'kvfence_gateway_budget_refusals_total{of="tenant",period="day",tenant="acme"} 1.0'
            in metrics
        )
    finally:
        for gw, runner in workers:
            await gw.session.close()
            await runner.cleanup()


async def test_a_registry_key_budget_holds_for_that_key_only(
    upstream: FakeUpstream, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    text = (
        policy_text(upstream.url).replace(
            "  access_log: false\n", f"  access_log: false\n  state_dir: {tmp_path}\n"
        )
        + "registry: true\n"
    )
    small, big = mint_key(), mint_key()
    store = OfflineRegistry(state_dir=tmp_path, pepper=PEPPER.encode())
    for key, budgets in ((small, {"hour": 10}), (big, None)):
        digest = key_digest(PEPPER.encode(), key)
        store.update(
            lambda doc, d=digest, b=budgets: reg.new_key(doc, "acme", d, known=["acme"], budgets=b)
        )
    gw, runner = await run_gateway(
        parse_policy(text, "t.yaml", env=ENV), upstream, state_dir=tmp_path
    )
    try:
        for key, expected in ((small, 200), (small, 429), (big, 200), (big, 200)):
            resp = await gw.session.post(gw.url + "/v1/chat/completions", json=CHAT,
                                         headers={"authorization": f"Bearer {key}"})  # fmt: skip
            assert resp.status == expected
            if expected == 429:
                assert "this API key's hourly token budget (10) is spent" in (await resp.text())
        assert 'kvfence_gateway_key_tokens_total{key="' in await gw.metrics()
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_budgets_hold_across_replicas_and_restarts_of_everything_but_the_database(
    postgres_server: PostgresServer, redis_server: RedisServer, tmp_path: Path
) -> None:
    a = FakeUpstream()
    await a.start()
    gateway = (
        f"  shared: {{redis: {{url: '{redis_server.url}', timeout_s: 0.5}}}}\n"
        f"  control: {{database: postgresql, url: '{postgres_server.url}',"
        " password: {env: PGPW}}\n"
    )
    text = fleet_policy_text(replica("a", a.url), gateway=gateway)
    text = text.replace("id: acme, ", "id: acme, budgets: {day: 40}, ")
    policy = parse_policy(text, "p.yaml", env={**ENV, "PGPW": PASSWORD})
    for n in ("s0", "s1", "n0", "n1"):
        (tmp_path / n).mkdir()
    gws = []
    try:
        gws = [await run_gateway(policy, a, state_dir=tmp_path / f"s{n}") for n in range(2)]
        (one, _), (two, _) = gws
        assert [(await status(gw))[0] for gw in (one, two, one)] == [200, 200, 200]  # 45 of 40
        assert (await status(two))[1] == "budget_exceeded"
        for gw, runner in gws:
            await gw.session.close()
            await runner.cleanup()
        redis_server.stop()  # Redis restarted empty, every gateway restarted on new state
        redis_server.start()
        gws = [await run_gateway(policy, a, state_dir=tmp_path / f"n{n}") for n in range(2)]
        for gw, _ in gws:
            assert (await status(gw))[1] == "budget_exceeded"
        assert len(a.received) == 3
    finally:
        for gw, runner in gws:
            await gw.session.close()
            await runner.cleanup()
        await a.close()
