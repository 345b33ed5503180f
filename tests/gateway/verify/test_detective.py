"""The detective audit on its own: a hit is explained by the namespace's own records, attributed
to another namespace (a violation at once, whatever the history's age), or explained by nobody
(unexplained); the four ways of sending the same tokens are one prompt; a tenant's traffic
evicts only its own records, and each tenant's reach is its own."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from gateway.inputs.paths import CHAT, COMPLETIONS, RESPONSES
from gateway.policy.backend_model import DetectiveSettings
from gateway.policy.load import parse_policy
from gateway.verify import fingerprints as fp
from gateway.verify.detective import ATTRIBUTED, NOBODY, NOT_BLOCKS, OWN, UNTRUSTED, Detective
from gateway.verify.history import Recorder
from gateway.verify.service import VERIFY
from gateway.verify.store import FingerprintStore
from gateway.verify.tokens import ChatTokenizer
from kvfence.verdict import Verdict
from tests.fakes.openai_upstream import FakeUpstream
from tests.kit.gateway import ENV, policy_text, run_gateway
from tests.kit.vllm_server import MODEL_DIR, await_build

BOUND = DetectiveSettings(block_size=16)
SYSTEM = {"role": "system", "content": "You answer questions about shipping. " * 8}
DOC = "Customs forms for pallets to Norway need the invoice, the weight and the tariff. " * 6


def chat(*turns: str) -> dict[str, Any]:
    roles = ["user", "assistant"]
    messages = [SYSTEM] + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]
    return {"model": "m", "messages": messages}


@pytest.fixture
def detective(tmp_path: Path) -> Detective:
    return Detective(FingerprintStore(tmp_path / "history.bin", 1 << 12, 1 << 10), b"s" * 32)


def need_tokenizer() -> None:
    await_build()
    if not (MODEL_DIR / "tokenizer.json").is_file():
        if os.environ.get("KVFENCE_REQUIRE_VLLM") == "1":  # scripts/vllm-env made it: required
            pytest.fail(f"KVFENCE_REQUIRE_VLLM=1 but {MODEL_DIR}/tokenizer.json is missing")
        pytest.skip("no tokenizer directory here (made by scripts/vllm-env)")


async def test_own_records_explain_and_another_namespaces_attribute(detective: Detective) -> None:
    first = await detective.record(BOUND, "acme", "ns-a", "m", CHAT, chat("What is a pallet?"))
    assert (await detective.judge(first, None, 60, True)).reason == OWN  # the template alone
    await detective.record_answer(first, "A flat platform for goods.")
    body = chat("What is a pallet?", "A flat platform for goods.", "Sizes?")
    second = await detective.record(BOUND, "acme", "ns-a", "m", CHAT, body)
    found = await detective.judge(second, None, 200, True)  # the earlier turn and its answer
    assert (found.verdict, found.reason) == (None, OWN)
    other = await detective.record(BOUND, "globex", "ns-b", "m", CHAT, chat("What is a pallet?"))
    leaked = await detective.judge(other, None, 200, True)  # B's first request hit A's blocks
    assert (leaked.verdict, leaked.reason) == (Verdict.VIOLATION, ATTRIBUTED)
    assert leaked.other == fp.label_of(fp.namespace_tag("ns-a"))
    assert leaked.as_json()["explained_by"] == "other"
    same_tenant = await detective.record(
        BOUND, "acme", "ns-a2", "m", CHAT, chat("What is a pallet?")
    )
    found = await detective.judge(same_tenant, None, 200, True)  # a session of the same tenant
    assert (found.verdict, found.reason) == (Verdict.VIOLATION, ATTRIBUTED)


async def test_a_hit_nobody_explains_is_unexplained_whatever_the_age(detective: Detective) -> None:
    obs = await detective.record(BOUND, "globex", "ns-b", "m", CHAT, chat("anything at all " * 20))
    found = await detective.judge(obs, None, 160, True)
    assert (found.verdict, found.reason) == (Verdict.UNEXPLAINED, NOBODY)
    assert (await detective.judge(obs, None, 0, True)).verdict is None
    untrusted = await detective.judge(obs, None, 160, False)  # a round saw cold hits reported
    assert (untrusted.verdict, untrusted.reason) == (None, UNTRUSTED)


async def test_a_later_request_of_the_same_namespace_explains_a_concurrent_hit(
    detective: Detective,
) -> None:
    first = await detective.record(BOUND, "acme", "ns-a", "m", CHAT, chat(DOC))
    assert not any(first.before)
    await detective.record(BOUND, "acme", "ns-a", "m", CHAT, chat(DOC))  # recorded after it
    found = await detective.judge(first, None, 300, True)  # the server served the other first
    assert (found.verdict, found.reason) == (None, OWN)


async def test_models_do_not_explain_each_other(detective: Detective) -> None:
    await detective.record(BOUND, "acme", "ns-a", "m1", CHAT, chat(DOC))
    other = await detective.record(BOUND, "globex", "ns-b", "m2", CHAT, chat(DOC))
    assert (await detective.judge(other, None, 300, True)).reason == NOBODY


SAME_TOKENS: list[tuple[str, str]] = [
    ("text parts", "one string"),
    ("completions text", "completions token ids"),
    ("chat", "its template as a completions prompt"),
    ("chat", "responses"),
]


def pair(first: str, second: str, tok: ChatTokenizer | None) -> list[tuple[str, dict[str, Any]]]:
    text = DOC + " What do I send?"
    messages = [{"role": "user", "content": text}]
    forms: dict[str, tuple[str, dict[str, Any]]] = {
        "text parts": (CHAT, {"messages": [{"role": "user", "content": [
            {"type": "text", "text": DOC}, {"type": "text", "text": " What do I send?"}]}]}),
        "one string": (CHAT, {"messages": [
            {"role": "user", "content": DOC + "\n What do I send?"}]}),
        "chat": (CHAT, {"messages": messages}),
        "responses": (RESPONSES, {"input": text}),
        "completions text": (COMPLETIONS, {"prompt": text}),
    }  # fmt: skip
    if tok is not None:
        rendered = tok.chat_text(messages)
        assert rendered is not None
        forms["its template as a completions prompt"] = (COMPLETIONS, {"prompt": rendered})
        forms["completions token ids"] = (COMPLETIONS, {"prompt": tok.text_ids(text)})
    return [forms[first], forms[second]]


@pytest.mark.parametrize(("first", "second"), SAME_TOKENS)
async def test_the_same_tokens_sent_another_way_are_the_tenants_own(
    tmp_path: Path, first: str, second: str
) -> None:
    need_tokenizer()
    tok = ChatTokenizer(MODEL_DIR)
    detective = Detective(FingerprintStore(tmp_path / "h.bin", 1 << 12, 1 << 10), b"s" * 32)
    exact = DetectiveSettings(tokenizer=MODEL_DIR, block_size=16)
    (path1, body1), (path2, body2) = pair(first, second, tok)
    sent = await detective.record(exact, "acme", "ns-a", "m", path1, {"model": "m", **body1})
    again = await detective.record(exact, "acme", "ns-a", "m", path2, {"model": "m", **body2})
    assert sent.exact is not None and again.exact is not None
    assert again.exact.keys == sent.exact.keys  # one prompt to the server, one to the history
    blocks = again.exact.total // 16 * 16
    found = await detective.judge(again, again.exact.total, blocks, True)
    assert (found.verdict, found.reason, found.mode) == (None, OWN, "exact")
    other = await detective.record(exact, "globex", "ns-b", "m", path2, {"model": "m", **body2})
    leaked = await detective.judge(other, other.exact.total if other.exact else None, blocks, True)
    assert (leaked.verdict, leaked.reason) == (Verdict.VIOLATION, ATTRIBUTED)


@pytest.mark.parametrize(("first", "second"), SAME_TOKENS[:1] + SAME_TOKENS[3:])
async def test_without_a_tokenizer_the_same_text_is_still_the_same_prompt(
    detective: Detective, first: str, second: str
) -> None:
    (path1, body1), (path2, body2) = pair(first, second, None)
    await detective.record(BOUND, "acme", "ns-a", "m", path1, {"model": "m", **body1})
    again = await detective.record(BOUND, "acme", "ns-a", "m", path2, {"model": "m", **body2})
    assert all(again.before)
    assert (await detective.judge(again, None, 112, True)).reason == OWN


async def test_exact_mode_says_a_count_of_partial_blocks_is_no_cache_hit(tmp_path: Path) -> None:
    need_tokenizer()
    detective = Detective(FingerprintStore(tmp_path / "h.bin", 1 << 12, 1 << 10), b"s" * 32)
    exact = DetectiveSettings(tokenizer=MODEL_DIR, block_size=16)
    obs = await detective.record(exact, "acme", "ns-a", "m", CHAT, chat(DOC))
    assert obs.exact is not None
    total = obs.exact.total
    found = await detective.judge(obs, total, total - 1, True)  # disaggregated prefill's count
    assert (found.verdict, found.reason) == (Verdict.UNEXPLAINED, NOT_BLOCKS)
    # A count the tokenizer disagrees with falls back to the (looser, still sound) bound.
    assert (await detective.judge(obs, total + 1, 16, True)).reason == OWN


async def test_a_tenant_evicts_only_its_own_records(tmp_path: Path) -> None:
    store = FingerprintStore(tmp_path / "h.bin", 1 << 12, 256)
    a, x = Recorder(1, 11), Recorder(2, 22)
    store.record_now(a, [5, 6, 7], 1, 1000.0)
    for i in range(40):  # x sends far more than its cap
        store.record_now(x, [1000 + 50 * i + k for k in range(50)], 2, 2000.0 + i)
    seen = await store.presence(a, [5, 6, 7], 9, [False, False, False])
    assert all(p.own for p in seen)
    reach = {r.tenant: r for r in await store.reach()}
    assert reach[2].evicted and reach[2].complete_since > 2000.0 and reach[2].entries <= 256
    assert not reach[1].evicted and reach[1].complete_since == store.created
    store.close()


async def test_the_history_is_shared_between_workers(tmp_path: Path) -> None:
    path = tmp_path / "h.bin"
    one, two = FingerprintStore(path, 1 << 12, 1 << 10), FingerprintStore(path, 1 << 12, 1 << 10)
    a, b = Recorder(1, 11), Recorder(2, 22)
    assert await one.record(a, [5, 6], 1) == [False, False]
    assert await two.record(a, [5, 7], 2) == [True, False]
    seen = await two.presence(b, [5, 6, 8], 3, [False] * 3)
    assert [p.other for p in seen] == [11, 11, 0] and not any(p.own for p in seen)
    one.close()
    two.close()


async def test_with_every_region_taken_a_new_tenant_shares_the_largest_ones(
    tmp_path: Path,
) -> None:
    store = FingerprintStore(tmp_path / "h.bin", 1024, 512)  # two regions
    store.record_now(Recorder(1, 11), [5], 1, 100.0)
    store.record_now(Recorder(2, 22), [6, 8], 2, 200.0)
    store.record_now(Recorder(3, 33), [7], 3, 300.0)  # shares tenant 2's region
    assert {r.tenant: r.entries for r in await store.reach()} == {1: 1, 2: 2, 3: 1}
    seen = await store.presence(Recorder(1, 11), [5], 9, [False])
    assert seen[0].own  # tenant 1 keeps its record
    seen = await store.presence(Recorder(3, 33), [5, 6, 7], 9, [False] * 3)
    assert [(p.own, p.other) for p in seen] == [(False, 11), (False, 22), (True, 0)]
    store.close()


async def test_under_capacity_pressure_a_quiet_tenants_prompt_is_still_attributed(
    tmp_path: Path,
) -> None:
    """More tenants than regions, one of them sending far more than the rest: the quiet tenant
    that sent one prompt long ago keeps it, so a server that serves another namespace a hit on
    that prompt is caught (`violation`), as it was before the pressure."""
    store = FingerprintStore(tmp_path / "h.bin", 1 << 10, 64)  # 16 regions
    detective = Detective(store, b"s" * 32)
    await detective.record(BOUND, "quiet", "ns-quiet", "m", CHAT, chat(DOC))  # long ago
    for i in range(40):  # 40 tenants; the first sends ten times as much
        for j in range(10 if i else 100):
            body = chat(f"tenant {i} asks question {j} about shipping pallets abroad")
            await detective.record(BOUND, f"t{i}", f"ns-{i}", "m", CHAT, body)
    assert len({r.tenant for r in await store.reach()}) == 41
    other = await detective.record(BOUND, "globex", "ns-b", "m", CHAT, chat(DOC))
    leaked = await detective.judge(other, None, 200, True)
    assert (leaked.verdict, leaked.reason) == (Verdict.VIOLATION, ATTRIBUTED)
    assert leaked.other == fp.label_of(fp.namespace_tag("ns-quiet"))
    again = await detective.record(BOUND, "quiet", "ns-quiet", "m", CHAT, chat(DOC))
    assert (await detective.judge(again, None, 200, True)).reason == OWN  # its own, still
    store.close()


async def test_a_new_tenant_takes_room_from_the_largest_tenants_oldest_records(
    tmp_path: Path,
) -> None:
    store = FingerprintStore(tmp_path / "h.bin", 1024, 256)  # four regions of 256
    for tenant in (1, 2, 3):
        store.record_now(Recorder(tenant, tenant * 11), [tenant], 1, 10.0)
    big = Recorder(4, 44)
    full = [256 * i for i in range(1, 9)]  # eight keys of one bucket: it is full
    for at, key in enumerate(full):
        store.record_now(big, [key], 2, 100.0 + at)
    new = Recorder(5, 55)  # every region is taken: it shares the largest tenant's
    store.record_now(new, [256 * 9, 256 * 10, 256 * 11], 3, 200.0)
    seen = await store.presence(big, full, 9, [False] * 8)
    assert [p.own for p in seen] == [False] * 3 + [True] * 5  # its three oldest went
    assert all(p.own for p in await store.presence(new, [2304, 2560, 2816], 9, [False] * 3))
    for tenant in (1, 2, 3):  # nobody else lost anything
        [p] = await store.presence(Recorder(tenant, tenant * 11), [tenant], 9, [False])
        assert p.own
    reach = {r.tenant: r for r in await store.reach()}
    assert reach[4].evicted and reach[4].entries == 5
    assert not any(reach[t].evicted for t in (1, 2, 3, 5))
    store.close()


def test_a_history_file_of_another_layout_is_refused(tmp_path: Path) -> None:
    FingerprintStore(tmp_path / "h.bin", 1 << 12, 1 << 10).close()
    with pytest.raises(ValueError, match="tenant_cap"):
        FingerprintStore(tmp_path / "h.bin", 1 << 12, 1 << 9)


def test_keys_name_the_prefix_and_the_model_never_the_namespace() -> None:
    stream, _ = fp.prompt_stream(CHAT, chat("hello there " * 10))
    positions = fp.checkpoints(stream)
    a = fp.bound_keys(b"s" * 32, "m", stream, positions)
    assert a == fp.bound_keys(b"s" * 32, "m", stream, positions)
    assert not set(a) & set(fp.bound_keys(b"s" * 32, "m2", stream, positions))
    assert not set(a) & set(fp.bound_keys(b"t" * 32, "m", stream, positions))  # keyed
    assert positions[-1] == len(stream) and positions[:3] == [32, 64, 128]


def test_an_earlier_releases_history_file_is_started_over(tmp_path: Path) -> None:
    old = tmp_path / "h.bin"
    old.write_bytes(b"KVFHIST1" + bytes(4088 + 64 * 16))
    store = FingerprintStore(old, 1 << 12, 1 << 10)
    assert store.regions == 4 and store.record_now(Recorder(1, 2), [3], 4, 5.0) == [False]
    store.close()


async def test_the_tokenizer_is_loaded_when_the_gateway_starts(upstream: FakeUpstream) -> None:
    need_tokenizer()
    exact = f"verify: {{canary: false, detective: {{tokenizer: '{MODEL_DIR}'}}}}"
    text = policy_text(upstream.url).replace("verify: {canary: false}", exact)
    gw, runner = await run_gateway(parse_policy(text, "t.yaml", env=ENV), upstream)
    try:
        assert MODEL_DIR in gw.app[VERIFY].detective._tokenizers  # before any request
        resp = await gw.chat(
            "acme", {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert resp.status == 200
    finally:
        await gw.session.close()
        await runner.cleanup()


def test_keys_go_on_from_a_prefix_as_if_the_whole_stream_were_hashed() -> None:
    prompt, _ = fp.prompt_stream(CHAT, chat("hello there " * 10))
    longer = prompt + fp.assistant_turn("General Kenobi. " * 12)
    hasher = fp.bound_hasher(b"s" * 32, "m")
    assert fp.extend_keys(hasher, prompt, 0, fp.checkpoints(prompt)) == fp.bound_keys(
        b"s" * 32, "m", prompt, fp.checkpoints(prompt)
    )
    tail = fp.checkpoints(longer, start=len(prompt))
    whole = fp.bound_keys(b"s" * 32, "m", longer, fp.checkpoints(longer))
    assert fp.extend_keys(hasher, longer, len(prompt), tail) == whole[-len(tail) :]
