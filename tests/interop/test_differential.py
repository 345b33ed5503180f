"""The same requests sent direct to the real vLLM and through the gateway under scripts/sidecar's
policy, compared on status, error shape, fields and, for greedy requests sent one at a time,
content. Any difference fails, unless docs/policy.md lists it as one of the gateway's own
refusals (the last tests check those stay listed).

One vLLM (the session's) and one gateway for the module; prompts stay under one cache block, so
no answer on either side comes from a cache hit that could change its numbers.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio

from gateway.app import create_app
from gateway.policy.load import parse_policy
from gateway.server import bound_port, start
from gateway.verify.service import VERIFY
from kvfence.keys.apikey import key_digest, mint_key
from scripts.sidecar_setup import ensure_receipt_keys
from scripts.sidecar_setup import policy as sidecar_policy
from tests.kit.polling import until
from tests.kit.vllm_server import SERVED_MODEL

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="module")]

ROOT = Path(__file__).resolve().parents[2]
KEY = mint_key()
PEPPER = "differential-pepper-0123456789"
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"
MSG = [{"role": "user", "content": "Name a colour of the sky."}]
GREEDY = {"model": SERVED_MODEL, "temperature": 0, "max_tokens": 4}


@dataclass
class Pair:
    direct: str
    gateway: str
    session: aiohttp.ClientSession

    async def both(
        self, method: str, path: str, body: dict[str, Any] | None = None
    ) -> tuple[tuple[int, str, bytes], tuple[int, str, bytes]]:
        """(status, content type, body) direct and through the gateway, one after the other."""
        out = []
        for base, headers in (
            (self.direct, {}),
            (self.gateway, {"authorization": f"Bearer {KEY}"}),
        ):
            async with self.session.request(method, base + path, json=body, headers=headers) as r:
                out.append((r.status, r.headers.get("content-type", ""), await r.read()))
        return out[0], out[1]


def _sidecar_policy_text(vllm_url: str, folder: Path) -> str:
    """scripts/sidecar's policy, with its tenant in the file instead of the registry."""
    for name, value in (("namespace-key", "n" * 43), ("pepper", PEPPER), ("audit-key", "a" * 43),
                        ("admin-token", "t" * 43)):  # fmt: skip
        (folder / "secrets").mkdir(exist_ok=True, mode=0o700)
        (folder / "secrets" / name).write_text(value)
        (folder / "secrets" / name).chmod(0o600)
    ensure_receipt_keys(folder / "secrets")  # the sidecar turns receipts on
    for sub in ("state", "audit", "anchor"):
        (folder / sub).mkdir(exist_ok=True, mode=0o700)
    text = sidecar_policy(vllm_url, SERVED_MODEL, 0, 0, 128)
    digest = key_digest(PEPPER.encode(), KEY)
    tenant = f'  - {{id: acme, api_keys: ["{digest}"], scope: tenant, models: [{SERVED_MODEL}]}}'
    assert "registry: true\ntenants: []\n" in text
    return text.replace("registry: true\ntenants: []\n", f"tenants:\n{tenant}\n")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def pair(vllm_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Pair]:
    folder = tmp_path_factory.mktemp("sidecar")
    text = _sidecar_policy_text(vllm_url, folder)
    app = create_app(parse_policy(text, str(folder / "policy.yaml"), env={}, base=folder))
    runner = await start(app, "127.0.0.1", 0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            # The first canary round runs at start: let it end, so nothing runs beside the
            # requests compared here (a batch can change a greedy answer's numbers).
            rounds = lambda: app[VERIFY].health.get("vllm").rounds  # noqa: E731
            await until(rounds, 300, "the first canary round")
            yield Pair(vllm_url, f"http://127.0.0.1:{bound_port(runner)}", session)
        finally:
            await runner.cleanup()


def _close(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-3, abs_tol=1e-3)
    return bool(a == b)


VOLATILE = {"id", "created", "created_at", "request_id", "system_fingerprint", "call_id"}


def assert_same(direct: Any, through: Any, where: str = "") -> None:
    """Equal shape everywhere, equal values but for ids and times (floats within 1e-3)."""
    if isinstance(direct, dict):
        assert isinstance(through, dict), where
        assert set(direct) == set(through), (where, set(direct) ^ set(through))
        for key, value in direct.items():
            if key not in VOLATILE:
                assert_same(value, through[key], f"{where}.{key}")
    elif isinstance(direct, list):
        assert isinstance(through, list) and len(direct) == len(through), where
        for i, (a, b) in enumerate(zip(direct, through, strict=True)):
            assert_same(a, b, f"{where}[{i}]")
    else:
        assert _close(direct, through), (where, direct, through)


def assert_answers_match(direct: tuple[int, str, bytes], through: tuple[int, str, bytes]) -> None:
    assert direct[0] == through[0], (direct, through)
    assert direct[1] == through[1], (direct[1], through[1])
    a, b = orjson.loads(direct[2]), orjson.loads(through[2])
    if direct[0] != 200:  # an error: the same OpenAI-shaped object, message included
        assert set(a) == set(b) == {"error"} and a["error"] == b["error"], (a, b)
        return
    assert_same(a, b)


def chat(**extra: Any) -> dict[str, Any]:
    return {**GREEDY, "messages": MSG, **extra}


def completion(**extra: Any) -> dict[str, Any]:
    return {**GREEDY, "prompt": "The sky is", **extra}


# Each documented vLLM field (gateway.inputs.kinds.VLLM), in a request that uses it.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": (CHAT, chat()),
    "chat logprobs": (CHAT, chat(logprobs=True, top_logprobs=2)),
    "chat n": (CHAT, chat(n=2, seed=1)),
    "chat stop": (CHAT, chat(stop=["\n"], max_tokens=8)),
    "chat response_format": (CHAT, chat(response_format={"type": "json_object"})),
    "chat top_k min_p": (CHAT, chat(top_k=5, min_p=0.1)),
    "chat repetition_penalty": (CHAT, chat(repetition_penalty=1.3)),
    "chat min_tokens ignore_eos": (CHAT, chat(min_tokens=3, ignore_eos=True)),
    "chat stop_token_ids": (CHAT, chat(stop_token_ids=[2], include_stop_str_in_output=True)),
    "chat prompt_logprobs": (CHAT, chat(prompt_logprobs=1)),
    "chat structured_outputs": (CHAT, chat(structured_outputs={"regex": "(blue|grey)"})),
    "chat return_token_ids": (CHAT, chat(return_token_ids=True)),
    "chat return_tokens_as_token_ids": (
        CHAT, chat(logprobs=True, return_tokens_as_token_ids=True)),
    "chat echo": (CHAT, chat(echo=True)),
    "chat truncation": (CHAT, chat(truncate_prompt_tokens=8, truncation_side="left")),
    "chat skip_special_tokens": (
        CHAT, chat(skip_special_tokens=False, spaces_between_special_tokens=False)),
    "chat bad_words": (CHAT, chat(bad_words=["blue"])),
    "chat allowed_token_ids": (CHAT, chat(allowed_token_ids=[28, 29, 30])),
    "chat add_generation_prompt": (CHAT, chat(add_generation_prompt=False)),
    "chat continue_final_message": (CHAT, {**GREEDY, "add_generation_prompt": False,
                                           "continue_final_message": True, "messages": [
        *MSG, {"role": "assistant", "content": "The sky is"}]}),
    "chat chat_template_kwargs": (CHAT, chat(chat_template_kwargs={"unused": True})),
    "chat use_beam_search": (CHAT, chat(use_beam_search=True, n=2, length_penalty=1.0)),
    "chat add_special_tokens": (CHAT, chat(add_special_tokens=True)),
    "chat documents": (CHAT, chat(documents=[{"title": "t", "text": "sky"}])),
    "chat include_reasoning": (CHAT, chat(include_reasoning=False)),
    "chat error: n": (CHAT, chat(n=0)),
    "chat error: messages": (CHAT, {**GREEDY, "messages": "not a list"}),
    "completion": (COMPLETIONS, completion()),
    "completion echo logprobs": (COMPLETIONS, completion(echo=True, logprobs=1, max_tokens=1)),
    "completion prompt_logprobs": (COMPLETIONS, completion(prompt_logprobs=2)),
    "completion token ids": (COMPLETIONS, completion(prompt=[504, 6123, 314])),
    "completion suffix-free best_of": (COMPLETIONS, completion(best_of=1)),
    "completion return_token_ids": (COMPLETIONS, completion(return_token_ids=True)),
    "completion structured_outputs": (
        COMPLETIONS, completion(structured_outputs={"choice": ["blue", "grey"]})),
    "completion truncation": (COMPLETIONS, completion(truncate_prompt_tokens=2,
                                                      truncation_side="left")),
    "completion error: logprobs": (COMPLETIONS, completion(logprobs=1000)),
    "responses": (RESPONSES, {"model": SERVED_MODEL, "input": "Name a colour.", "temperature": 0,
                              "max_output_tokens": 4}),
    "tokenize prompt": ("/tokenize", {"model": SERVED_MODEL, "prompt": "The sky is"}),
    "tokenize messages": ("/tokenize", {"model": SERVED_MODEL, "messages": MSG,
                                        "add_generation_prompt": True, "return_token_strs": True}),
    "detokenize": ("/detokenize", {"model": SERVED_MODEL, "tokens": [504, 6123, 314]}),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
async def test_plain_answers_match(pair: Pair, name: str) -> None:
    path, body = CASES[name]
    direct, through = await pair.both("POST", path, body)
    assert_answers_match(direct, through)


async def test_the_model_card_matches(pair: Pair) -> None:
    direct, through = await pair.both("GET", f"/v1/models/{SERVED_MODEL}")
    if direct[0] == 404:  # a vLLM without the retrieve route: compare the listing's card
        direct, through = await pair.both("GET", "/v1/models")
    assert direct[0] == through[0] == 200
    assert direct[1] == through[1]
    a, b = orjson.loads(direct[2]), orjson.loads(through[2])
    card = a if "data" not in a else next(c for c in a["data"] if c["id"] == SERVED_MODEL)
    assert_same(card, b if "data" not in b else b["data"][0])


def _events(raw: bytes) -> list[Any]:
    found: list[Any] = []
    for block in raw.replace(b"\r\n", b"\n").split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                data = line[6:]
                found.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return found


def _summary(events: list[Any]) -> dict[str, Any]:
    chunks = [e for e in events if isinstance(e, dict)]
    text = "".join(
        (c.get("delta") or {}).get("content") or c.get("text") or ""
        for e in chunks for c in e.get("choices") or []
    )  # fmt: skip
    return {
        "text": text,
        "done": events[-1:] == ["[DONE]"],
        "chunks": len(chunks),
        "with_usage": sum(1 for e in chunks if e.get("usage")),
        "usage_only": sum(1 for e in chunks if e.get("usage") and not e.get("choices")),
        "keys": sorted({k for e in chunks for k in e}),
    }


def _merged(direct: tuple[int, str, bytes], through: tuple[int, str, bytes]) -> bool:
    """Both streams say the same in a different number of chunks, and nothing else differs."""
    if direct[0] != 200 or through[0] != 200:
        return False
    d, t = _summary(_events(direct[2])), _summary(_events(through[2]))
    return d["chunks"] != t["chunks"] and d | {"chunks": 0} == t | {"chunks": 0}


OPTIONS: list[dict[str, Any] | None] = [
    None,
    {},
    {"include_usage": True},
    {"include_usage": False},
    {"include_usage": True, "continuous_usage_stats": True},
    {"include_usage": False, "continuous_usage_stats": True},
    {"continuous_usage_stats": True},
    {"include_usage": True, "continuous_usage_stats": False},
]


# Without `include_usage: true` the gateway still asks for usage upstream (its accounting), yet
# the client gets what vLLM sends it direct: no usage, and the fingerprint on the finish chunk.
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    "options", OPTIONS, ids=lambda o: "none" if o is None else orjson.dumps(o).decode()
)
async def test_streams_match(pair: Pair, path: str, options: dict[str, Any] | None) -> None:
    body = chat(stream=True) if path == CHAT else completion(stream=True)
    if options is not None:
        body["stream_options"] = options
    direct, through = await pair.both("POST", path, body)
    if _merged(direct, through):
        # vLLM merges the deltas a slow reader has not taken yet into one chunk: on a loaded
        # host the same text can come in fewer chunks on one side. Once more, and said so.
        logging.getLogger(__name__).warning("vLLM merged chunks on one side: compared again")
        direct, through = await pair.both("POST", path, body)
    assert direct[0] == through[0] == 200
    assert direct[1] == through[1]  # text/event-stream; charset=utf-8, as vLLM sends it
    assert _summary(_events(direct[2])) == _summary(_events(through[2]))
    assert_same(_events(direct[2]), _events(through[2]))  # event by event, key by key


async def test_a_plain_answer_keeps_its_charset(pair: Pair) -> None:
    direct, through = await pair.both("POST", "/tokenize", {"model": SERVED_MODEL,
                                                            "prompt": "L'Étoile"})  # fmt: skip
    assert direct[1] == through[1]
    assert_answers_match(direct, through)


# The gateway's own refusals: each is a difference docs/policy.md lists.
REFUSALS: dict[str, tuple[dict[str, Any], str]] = {
    "max_tokns": (chat(max_tokns=3), "unknown_field"),
    "priority": (chat(priority=1), "unknown_field"),
    "chat_template": (chat(chat_template="{{ 'x' }}"), "unknown_field"),
    "vllm_xargs": (chat(vllm_xargs={"a": 1}), "unknown_field"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
async def test_the_gateways_own_refusals_are_documented(pair: Pair, name: str) -> None:
    body, code = REFUSALS[name]
    _, through = await pair.both("POST", CHAT, body)
    assert through[0] == 400
    error = orjson.loads(through[2])["error"]
    assert (error["code"], error["param"]) == (code, name)
    section = (ROOT / "docs" / "policy.md").read_text().split("## The body allowlist")[1]
    assert f"`{name}`" in section or "a typo such as `max_tokns`" in section


async def test_a_scoping_field_is_stripped_not_refused(pair: Pair) -> None:
    direct, through = await pair.both("POST", CHAT, chat(cache_salt="client-salt"))
    assert_answers_match(direct, through)
