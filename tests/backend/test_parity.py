"""OpenAI parity of the backend over real HTTP on loopback: logprobs, several choices per
request (and the one attestation that covers them all), refusals that name the parameter the
backend does not implement, and GET /v1/models/{id}."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from backend.model.load import LoadedModel
from backend.server import create_app
from kvfence.attestation import ATTESTATION_FIELD, ATTESTATION_HEADER
from tests.kit.backend_server import Kit, make_kit

Client = TestClient[web.Request, web.Application]
MakeClient = Callable[[web.Application], Awaitable[Client]]
HI = [{"role": "user", "content": "Say something long about the sea."}]


@pytest.fixture
async def tiny(aiohttp_client: MakeClient, tiny_model: LoadedModel) -> tuple[Kit, Client]:
    kit = make_kit(tiny_model)
    return kit, await aiohttp_client(create_app(kit.backend))


def chat(kit: Kit, **fields: Any) -> dict[str, Any]:
    return {"model": kit.model, "messages": HI, "max_tokens": 12, "ignore_eos": True, **fields}


async def answer(kit: Kit, client: Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = await kit.post(client, "/v1/chat/completions", body, "ns-a")
    assert resp.status == 200, await resp.text()
    data: dict[str, Any] = await resp.json()
    data["attestation"] = kit.attestations.verify(resp.headers[ATTESTATION_HEADER])
    return data


async def events(kit: Kit, client: Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The stream's data events, the attestation head first; asserts it ends with [DONE]."""
    resp = await kit.post(client, "/v1/chat/completions", {**body, "stream": True}, "ns-a")
    assert resp.status == 200, await resp.text()
    raw = [e for e in (await resp.read()).decode().split("\n\n") if e]
    assert raw[-1] == "data: [DONE]"
    return [orjson.loads(e.split("data: ", 1)[1]) for e in raw[:-1]]


def streamed_choices(chunks: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per choice index: its text, logprobs entries and finish reason, from the chunks."""
    out: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            got = out.setdefault(c["index"], {"text": "", "logprobs": [], "finish": []})
            got["text"] += c["delta"].get("content") or ""
            got["logprobs"] += (c["logprobs"] or {}).get("content", [])
            if c["finish_reason"] is not None:
                got["finish"].append(c["finish_reason"])
    return out


async def test_greedy_logprobs_are_consistent_and_streamed_alike(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    body = chat(kit, temperature=0, logprobs=True, top_logprobs=4)
    data = await answer(kit, client, body)
    (choice,) = data["choices"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == data["usage"]["completion_tokens"] == 12  # one per token
    for entry in entries:
        assert entry["logprob"] <= 0 and len(entry["top_logprobs"]) == 4
        top = entry["top_logprobs"]
        assert entry["token"] == top[0]["token"] and entry["logprob"] == top[0]["logprob"]
        assert [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert bytes(entry["bytes"]).decode("utf-8", "backslashreplace") == entry["token"]
    text = b"".join(bytes(e["bytes"]) for e in entries if e["token"] != "<|im_end|>")
    assert text.decode("utf-8", "replace") == choice["message"]["content"]

    chunks = await events(kit, client, {**body, "stream_options": {"include_usage": True}})
    streamed = streamed_choices(chunks[1:])
    assert streamed[0]["text"] == choice["message"]["content"]
    assert streamed[0]["logprobs"] == entries
    assert streamed[0]["finish"] == [choice["finish_reason"]]
    use = chunks[-1]["usage"]
    assert use["completion_tokens"] == 12 and use["prompt_tokens"] == data["usage"]["prompt_tokens"]


async def test_logprobs_without_top_logprobs_list_no_alternatives(
    tiny: tuple[Kit, Client],
) -> None:
    kit, client = tiny
    plain = await answer(kit, client, chat(kit, temperature=0.9, logprobs=True))
    entries = plain["choices"][0]["logprobs"]["content"]
    assert len(entries) == 12 and all(e["top_logprobs"] == [] for e in entries)
    without = await answer(kit, client, chat(kit))
    assert without["choices"][0]["logprobs"] is None


async def test_n_choices_are_indexed_counted_and_attested_together(
    tiny: tuple[Kit, Client],
) -> None:
    kit, client = tiny
    body = chat(kit, n=3, temperature=1.5, max_tokens=10)
    data = await answer(kit, client, body)
    assert [c["index"] for c in data["choices"]] == [0, 1, 2]
    assert data["usage"]["completion_tokens"] == 30  # every choice's tokens
    assert len({c["message"]["content"] for c in data["choices"]}) > 1  # sampled apart
    att = data["attestation"]
    assert att.block_namespaces == frozenset({"ns-a"})
    assert att.prompt_tokens == data["usage"]["prompt_tokens"]
    assert att.cached_tokens == data["usage"]["prompt_tokens_details"]["cached_tokens"]

    chunks = await events(kit, client, {**body, "stream_options": {"include_usage": True}})
    head = chunks[0]
    assert [c["index"] for c in head["choices"]] == [0, 1, 2]
    assert all(c["delta"] == {"role": "assistant", "content": ""} for c in head["choices"])
    assert kit.attestations.verify(head[ATTESTATION_FIELD]).block_namespaces == {"ns-a"}
    streamed = streamed_choices(chunks[1:-1])
    assert sorted(streamed) == [0, 1, 2]
    assert all(s["finish"] == ["length"] for s in streamed.values())
    assert chunks[-1]["usage"]["completion_tokens"] == 30


async def test_greedy_choices_are_identical(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    data = await answer(kit, client, chat(kit, n=3, temperature=0, logprobs=True))
    first, *others = data["choices"]
    for other in others:
        assert other["message"] == first["message"] and other["logprobs"] == first["logprobs"]
    single = await answer(kit, client, chat(kit, temperature=0))
    assert single["choices"][0]["message"] == first["message"]  # n leaves greedy unchanged


async def test_a_seed_gives_the_same_choices_again(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    body = chat(kit, n=2, temperature=1.5, seed=11)
    texts = [[c["message"]["content"] for c in (await answer(kit, client, body))["choices"]]]
    texts.append([c["message"]["content"] for c in (await answer(kit, client, body))["choices"]])
    assert texts[0] == texts[1] and texts[0][0] != texts[0][1]


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"frequency_penalty": 1.0}, "frequency_penalty"),
        ({"colour": "blue"}, "colour"),
        ({"n": 9}, "n"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ],
)
async def test_what_is_not_implemented_is_a_400_naming_the_parameter(
    tiny: tuple[Kit, Client], fields: dict[str, Any], param: str
) -> None:
    kit, client = tiny
    resp = await kit.post(client, "/v1/chat/completions", chat(kit, **fields), "ns-a")
    assert resp.status == 400
    error = (await resp.json())["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"] or param == "n"


async def test_completions_carry_logprobs_in_their_own_shape(tiny: tuple[Kit, Client]) -> None:
    kit, client = tiny
    body = {
        "model": kit.model,
        "prompt": "abc",
        "max_tokens": 8,
        "ignore_eos": True,
        "temperature": 0,
        "logprobs": 2,
        "n": 2,
    }
    resp = await kit.post(client, "/v1/completions", body, "ns-a")
    data = await resp.json()
    assert [c["index"] for c in data["choices"]] == [0, 1]
    first = data["choices"][0]
    lp = first["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 8
    for token, value, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert value <= 0 and len(top) == 2 and top[token] == value == max(top.values())
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert data["usage"]["completion_tokens"] == 16

    raw = await (await kit.post(client, "/v1/completions", {**body, "stream": True}, "ns-a")).read()
    chunks = [orjson.loads(e.split(b"data: ", 1)[1]) for e in raw.split(b"\n\n")[:-2] if e]
    streamed: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for chunk in chunks[1:]:
        for c in chunk["choices"]:
            if c["index"] == 0 and c["logprobs"]:
                for key, values in streamed.items():
                    values += c["logprobs"][key]
    assert streamed == {key: lp[key] for key in streamed}
    bad = await kit.post(client, "/v1/completions", {**body, "logprobs": 6}, "ns-a")
    assert bad.status == 400 and (await bad.json())["error"]["param"] == "logprobs"


async def test_a_model_is_retrieved_by_id_and_an_unknown_one_is_404(
    tiny: tuple[Kit, Client],
) -> None:
    kit, client = tiny
    resp = await client.get(f"/v1/models/{kit.model}")
    assert resp.status == 200
    assert await resp.json() == {
        "id": kit.model,
        "object": "model",
        "created": 0,
        "owned_by": "kvfence",
    }
    resp = await client.get("/v1/models/gpt-5")
    assert resp.status == 404
    error = (await resp.json())["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")


async def test_the_attestation_covers_the_blocks_of_every_choice(
    aiohttp_client: MakeClient, tiny_model: LoadedModel
) -> None:
    """Only the last choice's sequence is given another namespace's cached block: the one
    attestation of the request still names that namespace, streamed or not."""
    kit = make_kit(tiny_model, leaky=True)
    client = await aiohttp_client(create_app(kit.backend))
    prompt = "a prompt long enough to fill two blocks of sixteen tokens"
    first = {"model": kit.model, "prompt": prompt, "max_tokens": 2}
    assert (await kit.post(client, "/v1/completions", first, "ns-a")).status == 200
    leaky = kit.engine.scheduler  # type: ignore[attr-defined]
    body = {"model": kit.model, "prompt": prompt.upper(), "max_tokens": 2, "n": 3}
    for last, stream in ((4, False), (7, True)):  # ns-b's choices: sequences 2-4, then 5-7
        leaky.leak_into = lambda seq, last=last: seq.seq_id == last
        resp = await kit.post(client, "/v1/completions", {**body, "stream": stream}, "ns-b")
        assert resp.status == 200
        if stream:
            head = (await resp.read()).split(b"\n\n")[0].split(b"data: ", 1)[1]
            token = orjson.loads(head)[ATTESTATION_FIELD]
        else:
            token = resp.headers[ATTESTATION_HEADER]
        att = kit.attestations.verify(token)
        assert att.block_namespaces == frozenset({"ns-a", "ns-b"})
        if not stream:  # choice 0 found nothing of ns-b's cached; the leaked choice did
            assert att.cached_tokens == 0
