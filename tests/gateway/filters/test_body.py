"""The body passes an allowlist: what the fake upstream receives holds the OpenAI fields of the
path, the fields its backend kind's server documents and the extra fields the policy allows, and
none of the fields that name blocks, engines, hosts, sessions, request ids, previous responses or
multimodal cache ids, at the top level, in messages, in content parts or in Responses input
items. A field the gateway does not know is a 400 naming it, unless the policy drops such fields.
Integers beyond 64 bits arrive with their exact digits."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.inputs import fields, kinds
from gateway.inputs.allowlist import prune
from gateway.policy.load import parse_policy
from gateway.policy.node import PolicyError
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, KEYS, Gateway, policy_text, run_gateway
from tests.kit.probes import FORWARDED_BEFORE, OPENAI_KEPT, chat_body

CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


async def gateway_for(upstream: FakeUpstream, text: str) -> tuple[Gateway, Any]:
    return await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)


def with_backend(text: str, kind: str = "vllm", *lines: str) -> str:
    extra = "".join(f"    {line}\n" for line in lines)
    return text.replace("    kind: vllm\n", f"    kind: {kind}\n{extra}")


@pytest.fixture
async def vllm(upstream: FakeUpstream) -> AsyncIterator[Gateway]:
    gw, runner = await gateway_for(upstream, policy_text(upstream.url))
    yield gw
    await gw.session.close()
    await runner.cleanup()


async def send(gw: Gateway, path: str, body: dict[str, Any] | bytes) -> tuple[int, Any]:
    kw: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
    headers = {**gw.auth("acme"), "content-type": "application/json"}
    resp = await gw.session.post(gw.url + path, headers=headers, **kw)
    return resp.status, await resp.json()


def names_in(value: Any) -> set[str]:
    """Every key anywhere in `value`."""
    if isinstance(value, dict):
        return set(value) | {n for v in value.values() for n in names_in(v)}
    if isinstance(value, list):
        return {n for v in value for n in names_in(v)}
    return set()


# What the allowlist strips (NEVER names): the rest of FORWARDED_BEFORE is refused (below).
STRIPPED = {k: v for k, v in FORWARDED_BEFORE.items() if k in fields.NEVER}


async def test_no_field_that_names_blocks_hosts_sessions_or_ids_is_forwarded(
    vllm: Gateway,
) -> None:
    status, _ = await send(vllm, CHAT, chat_body(**STRIPPED))
    assert status == 200
    sent = vllm.upstream.received[-1].json
    never = set(FORWARDED_BEFORE) | fields.NEVER | {"worker_id"}
    assert names_in(sent) & never == {"cache_salt"}  # the one scoping field: the adapter's
    assert b"victim" not in vllm.upstream.received[-1].body
    assert {k: sent[k] for k in OPENAI_KEPT} == OPENAI_KEPT
    assert sent["cache_salt"].startswith("ns1.")
    [message] = sent["messages"]
    assert message == {
        "role": "user",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
        ],
    }


@pytest.mark.parametrize("path", [COMPLETIONS, RESPONSES])
async def test_every_path_is_allowlisted(vllm: Gateway, path: str) -> None:
    body: dict[str, Any] = {"model": "smollm2", **STRIPPED, "temperature": 0.5}
    if path == COMPLETIONS:
        body["prompt"] = "hi"
    else:
        body["conversation"] = "conv_victim"
        body["input"] = [
            {"type": "item_reference", "id": "msg_victim"},
            {"role": "user", "session_id": "s", "content": [
                {"type": "input_text", "text": "hi", "uuid": "u"},
                {"type": "input_image", "image_url": "data:,", "content_hash": "h"}]},
        ]  # fmt: skip
    status, _ = await send(vllm, path, body)
    assert status == 200
    sent = vllm.upstream.received[-1].json
    assert names_in(sent) & (set(FORWARDED_BEFORE) | fields.NEVER) == {"cache_salt"}
    assert b"victim" not in vllm.upstream.received[-1].body
    assert sent["temperature"] == 0.5
    if path == RESPONSES:
        assert sent["input"] == [
            {"role": "user", "content": [
                {"type": "input_text", "text": "hi"},
                {"type": "input_image", "image_url": "data:,"}]},
        ]  # fmt: skip


async def test_the_servers_own_fields_pass_by_default(vllm: Gateway) -> None:
    extra = {"top_k": 5, "min_p": 0.1, "prompt_logprobs": 1, "structured_outputs": {"regex": "a"},
             "return_token_ids": True, "echo": True, "min_tokens": 2, "truncation_side": "left",
             "truncate_prompt_tokens": 64}  # fmt: skip
    status, _ = await send(vllm, CHAT, chat_body(**extra))
    assert status == 200
    sent = vllm.upstream.received[-1].json
    assert {k: sent[k] for k in extra} == extra
    status, _ = await send(vllm, COMPLETIONS, {"model": "smollm2", "prompt": "hi", "echo": True,
                                               "logprobs": 1, "prompt_logprobs": 0})  # fmt: skip
    assert status == 200
    assert vllm.upstream.received[-1].json["prompt_logprobs"] == 0


@pytest.mark.parametrize(
    ("body", "param", "hint"),
    [
        ({"max_tokns": 5}, "max_tokns", "backends[].extra_fields"),
        ({"priority": -100}, "priority", "backends[].extra_fields"),
        ({"chat_template": "{{ 'x' }}"}, "chat_template", "never forwarded"),
        ({"nvext": {"top_k": 1}}, "nvext", "backends[].extra_fields"),
        ({"messages": [{"role": "user", "content": "hi", "cache_control": {}}]},
         "messages.cache_control", "backends[].extra_fields"),
        ({"messages": [{"role": "user", "content": [{"type": "image_embeds"}]}]},
         "messages.content.image_embeds", "backends[].extra_fields"),
    ],
)  # fmt: skip
async def test_a_field_the_gateway_does_not_forward_is_a_400_naming_it(
    vllm: Gateway, body: dict[str, Any], param: str, hint: str
) -> None:
    status, answer = await send(vllm, CHAT, {**chat_body(), **body})
    assert status == 400
    error = answer["error"]
    assert (error["code"], error["param"], error["type"]) == (
        "unknown_field",
        param,
        "invalid_request_error",
    )
    assert param in error["message"] and hint in error["message"]
    assert vllm.upstream.received == []


async def test_extra_fields_pass_only_where_the_policy_allows_them(
    upstream: FakeUpstream,
) -> None:
    text = with_backend(policy_text(upstream.url), "vllm", "extra_fields: [priority, new_knob]")
    gw, runner = await gateway_for(upstream, text)
    try:
        body = chat_body(top_k=5, priority=1, new_knob="x", min_p=0.1, rid="x")
        status, _ = await send(gw, CHAT, body)
        assert status == 200
        sent = upstream.received[-1].json
        assert (sent["top_k"], sent["priority"], sent["new_knob"], sent["min_p"]) == (
            5,
            1,
            "x",
            0.1,
        )
        assert "rid" not in sent
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_unknown_fields_drop_is_an_explicit_choice(upstream: FakeUpstream) -> None:
    text = policy_text(upstream.url).replace("client_inputs: strip", "client_inputs: strip\n"
                                             "  unknown_fields: drop")  # fmt: skip
    gw, runner = await gateway_for(upstream, text)
    try:
        status, _ = await send(gw, CHAT, chat_body(max_tokns=5, priority=3))
        assert status == 200
        sent = upstream.received[-1].json
        assert "max_tokns" not in sent and "priority" not in sent
        metrics = await gw.metrics()
        assert 'field="priority"' in metrics and 'action="drop"' in metrics
        assert 'field="other"' in metrics  # an unknown name is never a metric label
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_dynamo_keeps_only_the_allowed_nvext_fields(upstream: FakeUpstream) -> None:
    text = with_backend(policy_text(upstream.url), "dynamo")
    gw, runner = await gateway_for(upstream, text)
    try:
        nvext = {"top_k": 4, "backend_instance_id": 9, "session_control": {"id": "s"},
                 "cache_salt": "evil", "greed_sampling": True}  # fmt: skip
        status, _ = await send(gw, CHAT, chat_body(nvext=nvext))
        assert status == 200
        assert upstream.received[-1].json["nvext"] == {"top_k": 4, "greed_sampling": True}
    finally:
        await gw.session.close()
        await runner.cleanup()


@pytest.mark.parametrize(
    ("kind", "name", "why"),
    [
        ("vllm", "kv_transfer_params", "never forwarded"),
        ("vllm", "request_id", "never forwarded"),
        ("sglang", "bootstrap_host", "never forwarded"),
        ("sglang", "rid", "never forwarded"),
        ("trtllm", "disaggregated_params", "never forwarded"),
        ("dynamo", "nvext.backend_instance_id", "never forwarded"),
        ("dynamo", "nvext.session_control", "never forwarded"),
        ("vllm", "uuid", "never forwarded"),
        ("vllm", "chat_template", "not an extra field kind vllm takes"),
        ("vllm", "vllm_xargs", "not an extra field kind vllm takes"),
        ("kvfence", "top_k", "not an extra field kind kvfence takes"),
        ("openai", "top_k", "not an extra field kind openai takes"),
    ],
)
def test_the_policy_refuses_fields_no_backend_may_get(kind: str, name: str, why: str) -> None:
    text = with_backend(policy_text("http://127.0.0.1:9"), kind, f'extra_fields: ["{name}"]')
    if kind in ("openai",):
        text = text.replace(f"kind: {kind}\n", f"kind: {kind}\n    allow_unscoped: true\n")
    with pytest.raises(PolicyError) as info:
        parse_policy(text, "t.yaml", env=ENV)
    assert any(why in line and "extra_fields" in line for line in info.value.errors)


def test_the_lists_keep_their_invariant() -> None:
    never = fields.NEVER | set(fields.REFUSED)
    for kind, paths in kinds.FORWARD.items():
        for path, names in paths.items():
            assert not names & never, (kind, path)
            assert not names & kinds.held(kind), (kind, path)
    for kind, names in kinds.HELD.items():
        assert not names & never, kind
    for path, names in fields.OPENAI.items():
        assert not names & never, path
    pruned = prune(CHAT, {"model": "m", "cache_salt": "x"}, "vllm", frozenset({"cache_salt"}))
    assert (pruned.stripped, pruned.refused) == (["cache_salt"], [])


def test_docs_list_every_field_the_code_knows() -> None:
    text = (Path(__file__).parents[3] / "docs" / "policy.md").read_text()
    section = text[text.index("## The body allowlist") : text.index("## `tenants[]`")]
    listed = set(re.findall(r"`([a-z_.]+)`", section))
    assert (
        kinds.KNOWN - {n for n in kinds.KNOWN if n.startswith(("messages.", "input."))} - listed
        == set()
    )
    for kind, paths in kinds.FORWARD.items():
        rows = [line for line in section.splitlines() if line.startswith(f"| `{kind}` ")]
        assert rows, kind
        named = set().union(*(set(re.findall(r"`([a-z_.]+)`", row)) for row in rows)) - {kind}
        assert named == set().union(*paths.values(), kinds.held(kind)), kind


async def test_scoping_fields_are_stripped_or_refused_as_client_inputs_says(
    upstream: FakeUpstream,
) -> None:
    text = policy_text(upstream.url).replace("client_inputs: strip", "client_inputs: reject")
    gw, runner = await gateway_for(upstream, text)
    try:
        status, body = await send(gw, CHAT, chat_body(kv_transfer_params={"x": 1}))
        assert (status, body["error"]["code"]) == (400, "cache_scoping_input_rejected")
        assert body["error"]["param"] == "kv_transfer_params"
        status, body = await send(gw, CHAT, chat_body())  # the content-part uuid alone
        assert (status, body["error"]["param"]) == (400, "messages.uuid")
        assert upstream.received == []
        plain = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        assert (await send(gw, CHAT, plain))[0] == 200
        metrics = await gw.metrics()
        assert 'field="kv_transfer_params"' in metrics and 'action="reject"' in metrics
    finally:
        await gw.session.close()
        await runner.cleanup()


async def test_scoping_fields_are_stripped_and_counted_by_default(vllm: Gateway) -> None:
    status, _ = await send(vllm, CHAT, chat_body(kv_transfer_params={"x": 1}))
    assert status == 200
    assert "kv_transfer_params" not in vllm.upstream.received[-1].json
    metrics = await vllm.metrics()
    assert 'field="kv_transfer_params"' in metrics and 'action="strip"' in metrics


BIG = [
    ("seed", b"18446744073709551616"),  # 2^64
    ("max_tokens", b"340282366920938463463374607431768211457"),  # 2^128 + 1
    ("n", b"-9223372036854775809"),  # -2^63 - 1
]


@pytest.mark.parametrize(("name", "digits"), BIG)
async def test_large_integers_pass_unchanged(vllm: Gateway, name: str, digits: bytes) -> None:
    raw = (
        b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], '
        b'"logit_bias": {"7": -100}, "' + name.encode() + b'": ' + digits + b", "
        b'"tools": [{"type": "function", "function": {"name": "f", "parameters": '
        b'{"type": "integer", "maximum": ' + digits + b", "
        b'"minimum": 1.5e300}}}]}'
    )
    status, _ = await send(vllm, CHAT, raw)
    assert status == 200
    body = vllm.upstream.received[-1].body
    assert body.count(b":" + digits) == 2, body
    assert b"e+" not in body.split(b'"minimum"')[0]  # no integer became a float
    assert json.loads(body)[name] == int(digits)


async def test_a_body_of_only_big_integers_still_needs_to_be_json(vllm: Gateway) -> None:
    for raw in (b'{"seed": 18446744073709551616', b'{"seed": 1' + b"0" * 5000 + b"}", b"[1]"):
        status, body = await send(vllm, CHAT, raw)
        assert (status, body["error"]["code"]) == (400, "invalid_request")
    assert vllm.upstream.received == []
    assert KEYS  # the fixtures' tenants are unchanged
