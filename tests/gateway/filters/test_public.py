"""Public prefixes at the gateway: which leading part of a request is public (pure matching),
the refusal of a public mark the policy does not allow, and an external backend that cannot
split a cache salt: the request stays isolated and /status says so."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from gateway.policy.load import parse_policy
from gateway.policy.prefixes import backend_status, marked, match_chat, match_prompt, plain_messages
from gateway.policy.runtime import Runtime
from gateway.policy.tenant_model import PublicPrefix
from gateway.server import bound_port, start_admin
from kvfence.public import chat_digest, text_digest
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, Gateway, policy_text, run_gateway

SYSTEM = "You are the support assistant of a large bookshop."
PUBLIC = f"""\
public:
  prefixes:
    - {{name: shop, model: smollm2, text: "{SYSTEM}"}}
    - {{name: shop-greeting, model: smollm2, messages: [{{role: system, text: "{SYSTEM}"}},
        {{role: user, text: "Hello"}}]}}
"""


def policy(url: str) -> str:
    text = policy_text(url, extra=PUBLIC)
    return text.replace("scope: session,", "scope: session, public: {own: true},", 1)


def prefixes() -> tuple[PublicPrefix, ...]:
    runtime = Runtime(parse_policy(policy("http://127.0.0.1:9"), "p.yaml", env=ENV))
    return runtime.public_prefixes["smollm2"]


def test_the_longest_declared_prefix_the_chat_starts_with() -> None:
    chat = plain_messages(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello there"}]
    )
    assert match_chat(chat, prefixes()) == (
        2, 5, chat_digest([("system", SYSTEM), ("user", "Hello")])
    )  # fmt: skip
    alone = plain_messages([{"role": "developer", "content": SYSTEM + " Today: sales."}])
    assert match_chat(alone, prefixes()) == (1, len(SYSTEM), chat_digest([("system", SYSTEM)]))


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": SYSTEM}],  # the right text in another role
        [{"role": "system", "content": SYSTEM[:-1]}],  # a shorter text
        [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        [{"role": "user", "content": "hi"}, {"role": "system", "content": SYSTEM}],  # not leading
    ],
)
def test_nothing_else_is_public(messages: list[dict[str, object]]) -> None:
    assert match_chat(plain_messages(messages), prefixes()) is None


def test_completion_prompts_and_marks() -> None:
    assert match_prompt(SYSTEM + " Q: hours?", prefixes()) == (0, len(SYSTEM), text_digest(SYSTEM))
    assert match_prompt(["Q: " + SYSTEM], prefixes()) is None
    chat = plain_messages([{"role": "system", "content": "mine"}, {"role": "user", "content": 3}])
    assert marked(chat, 1) == (1, 4, chat_digest([("system", "mine")]))
    assert marked(chat, 2) is None  # not plain text: never public


@pytest.fixture
async def gw(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    gateway, runner = await run_gateway(
        parse_policy(policy(upstream.url), "p.yaml", env=ENV), upstream
    )
    yield gateway
    await gateway.session.close()
    await runner.cleanup()


BODY = {
    "model": "smollm2",
    "messages": [{"role": "system", "content": SYSTEM}],
    "prompt_cache_key": "session-1",  # umbrella's session id; the others' copy is stripped
}


@pytest.mark.parametrize(
    ("tenant", "value", "message"),
    [
        ("acme", "1", "this tenant may not mark messages public"),
        ("umbrella", "2", "one count of leading messages, 1 to 1"),
        ("umbrella", "one", "one count of leading messages"),
        ("umbrella", "\u00b9", "one count of leading messages"),  # a digit int() refuses
        ("umbrella", "0", "one count of leading messages"),
    ],
)
async def test_a_public_mark_the_policy_does_not_allow_is_refused(
    gw: Gateway, tenant: str, value: str, message: str
) -> None:
    headers = {"x-kvfence-public-messages": value}
    async with await gw.chat(tenant, BODY, **headers) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["code"] == "public_mark_refused" and message in error["message"]
    assert gw.upstream.received == []


async def test_an_external_backend_keeps_the_request_isolated(gw: Gateway) -> None:
    headers = {"x-kvfence-public-messages": "1"}
    async with await gw.chat("umbrella", BODY, **headers) as resp:
        assert resp.status == 200
    async with await gw.chat("acme", BODY) as resp:
        assert resp.status == 200
    salts = [orjson.loads(r.body)["cache_salt"] for r in gw.upstream.received]
    assert len(set(salts)) == 2  # the declared prompt did not make the two share a salt
    admin = await start_admin(gw.app, "127.0.0.1", 0)
    try:
        async with gw.session.get(f"http://127.0.0.1:{bound_port(admin)}/status") as resp:
            status = (await resp.json())["backends"]["fake-vllm"]["public_prefixes"]
    finally:
        await admin.cleanup()
    assert status.startswith("not applied: a vllm backend takes one cache salt per request")


def test_status_is_silent_where_no_public_prefix_concerns_a_backend() -> None:
    parsed = parse_policy(policy_text("http://127.0.0.1:9"), "p.yaml", env=ENV)
    assert backend_status(parsed, parsed.backends[0]) is None
