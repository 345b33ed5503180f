"""Any replica: two gateways sharing one control database (SQLite under one state folder, or a
real PostgreSQL for a fleet) serve each other's receipts and proofs; a tenant verifies a receipt
one replica issued with what the other serves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.gateway.receipts.conftest import Stack
from tests.gateway.receipts.test_receipts import CHAT, ask
from tests.kit.gateway import ENV, policy_text, run_gateway
from tests.kit.postgres_server import PASSWORD, PostgresServer
from tests.kit.receipts import ReceiptKeys, with_receipts


@asynccontextmanager
async def replicas(
    keys: ReceiptKeys, upstream: FakeUpstream, control: str = ""
) -> AsyncIterator[tuple[Stack, Stack]]:
    text = with_receipts(policy_text(upstream.url), keys)
    if control:
        text = text.replace("gateway:\n", "gateway:\n" + control, 1)
    async with AsyncExitStack() as stack:
        started = []
        for name in ("one", "two"):  # each its own audit log, one state folder (SQLite)
            (keys.folder / name).mkdir(mode=0o700)
            own = text.replace(
                str(keys.folder / "log" / "audit"), str(keys.folder / name / "audit")
            )
            env = {**ENV, "PGPW": PASSWORD}
            policy = parse_policy(own, str(keys.folder / "p.yaml"), env=env, base=keys.folder)
            gw, runner = await run_gateway(policy, upstream, state_dir=keys.folder / "state")
            stack.push_async_callback(runner.cleanup)
            stack.push_async_callback(gw.session.close)
            started.append(Stack(gw, keys))
        yield started[0], started[1]


async def check_both_ways(one: Stack, two: Stack) -> None:
    for issuer, other in ((one, two), (two, one)):
        status, request, response, receipt_id = await ask(issuer, "acme", CHAT)
        assert status == 200 and receipt_id
        report = await other.tenant("acme").verify(receipt_id, request, response)
        assert report.ok, report.checks
        status, _ = await other.tenant("globex").get(f"/v1/kvfence/receipts/{receipt_id}")
        assert status == 404


async def test_replicas_sharing_sqlite_serve_each_others_receipts(
    receipt_keys: ReceiptKeys, upstream: FakeUpstream
) -> None:
    async with replicas(receipt_keys, upstream) as (one, two):
        await check_both_ways(one, two)


@pytest.mark.slow
async def test_replicas_sharing_postgresql_serve_each_others_receipts(
    receipt_keys: ReceiptKeys, upstream: FakeUpstream, postgres_server: PostgresServer
) -> None:
    control = (
        f"  control: {{database: postgresql, url: '{postgres_server.url}', "
        "password: {env: PGPW}}\n"
    )
    async with replicas(receipt_keys, upstream, control) as (one, two):
        await check_both_ways(one, two)
