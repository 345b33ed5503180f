"""A gateway with receipts and the witnessed audit log on, in front of a fake vLLM (tenant
umbrella has receipts turned off); `open_stack` starts one on given key files, so a test can
stop it, tamper with its files and start it again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.policy.load import parse_policy
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, Gateway, policy_text, run_gateway
from tests.kit.receipts import ReceiptKeys, Tenant, make_receipt_keys, with_receipts


@dataclass
class Stack:
    gw: Gateway
    keys: ReceiptKeys

    def tenant(self, name: str) -> Tenant:
        return Tenant(self.gw.url, KEYS[name], self.gw.session, self.keys.log_key)


@asynccontextmanager
async def open_stack(keys: ReceiptKeys, upstream: FakeUpstream) -> AsyncIterator[Stack]:
    text = with_receipts(policy_text(upstream.url), keys)
    text = text.replace("scope: session,\n", "scope: session, receipts: false,\n", 1)
    policy = parse_policy(text, str(keys.folder / "policy.yaml"), env=ENV, base=keys.folder)
    gw, runner = await run_gateway(policy, upstream, state_dir=keys.folder / "state")
    try:
        yield Stack(gw, keys)
    finally:
        await gw.session.close()
        await runner.cleanup()


@pytest.fixture
def receipt_keys(tmp_path: Path) -> ReceiptKeys:
    return make_receipt_keys(tmp_path)


@pytest.fixture
async def stack(receipt_keys: ReceiptKeys, upstream: FakeUpstream) -> AsyncIterator[Stack]:
    async with open_stack(receipt_keys, upstream) as opened:
        yield opened
