"""The kvfence backend kind: handles minted per request, attestations judged before any byte
reaches the client, verdicts in a header and in the audit log. The backend is the real server
with a tiny random model; a fake backend stands in only where an attestation must be wrong."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from backend.model.load import LoadedModel
from gateway.audit.sink import AUDIT_SINK
from gateway.metrics import METRICS
from kvfence.attestation import ATTESTATION_HEADER, AttestationSigner
from kvfence.cli import main as kvfence_main
from kvfence.handle import HANDLE_HEADER, HandleSigner, HandleVerifier
from kvfence.keys.keyfile import TrustStore, generate_key, load_private_key
from tests.kit.polling import until
from tests.kit.stack import AUDIENCE, Keys, Stack, make_backend, make_keys, running_stack

PROMPT = "the quick brown fox jumps over the lazy dog, " * 3  # several 16-token blocks


def completion(prompt: str = PROMPT, **extra: Any) -> dict[str, Any]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}


def cached(body: dict[str, Any]) -> int:
    return int(body["usage"]["prompt_tokens_details"]["cached_tokens"])


def records(stack: Stack) -> list[dict[str, Any]]:
    lines = stack.audit_log.read_bytes().splitlines()
    return [
        r
        for r in map(orjson.loads, lines)
        if r.get("kind") == "record" and r.get("phase") != "open"
    ]


def verify_log(stack: Stack) -> int:
    return kvfence_main(
        ["audit", "verify", str(stack.audit_log), "--key-file", str(stack.keys.audit_key_file)]
    )


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return make_keys(tmp_path)


@pytest.fixture
async def stack(tiny_model: LoadedModel, keys: Keys) -> AsyncIterator[Stack]:
    async with running_stack(make_backend(tiny_model, keys), keys, "tiny") as s:
        yield s


async def test_handles_reach_the_backend_and_answers_are_judged_clean(stack: Stack) -> None:
    first = await stack.post("acme", completion(), path="/v1/completions")
    assert first.status == 200, await first.text()
    assert first.headers["x-kvfence-verdict"] == "clean"
    assert ATTESTATION_HEADER not in first.headers
    again = await stack.post("acme", completion(), path="/v1/completions")
    assert cached(await again.json()) > 0
    other = await stack.post("globex", completion(), path="/v1/completions")
    assert cached(await other.json()) == 0
    assert other.headers["x-kvfence-verdict"] == "clean"
    logged = records(stack)
    assert [r["verdict"] for r in logged] == ["clean"] * 3
    assert [r["tenant"] for r in logged] == ["acme", "acme", "globex"]
    assert logged[1]["cached_tokens"] > 0 and logged[1]["attestation"]
    assert logged[0]["namespace"] == logged[1]["namespace"] != logged[2]["namespace"]
    assert verify_log(stack) == 0


async def test_a_client_handle_is_replaced_by_the_gateways_own(stack: Stack, keys: Keys) -> None:
    await stack.post("acme", completion(), path="/v1/completions")
    # A handle for acme's namespace would need the gateway's key; a client has only its own.
    forged = HandleSigner(generate_key(), "gateway").sign(
        "ns1.x", "tiny", "1", "r", AUDIENCE, body=b"{}"
    )
    resp = await stack.post(
        "globex", completion(), path="/v1/completions", **{HANDLE_HEADER: forged}
    )
    assert resp.status == 200 and cached(await resp.json()) == 0
    assert resp.headers["x-kvfence-verdict"] == "clean"


async def test_a_stream_starts_with_the_attestation_stripped_and_ends_with_done(
    stack: Stack,
) -> None:
    resp = await stack.post("acme", completion(stream=True), path="/v1/completions")
    assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == "clean"
    raw = await resp.read()
    assert b"kvfence" not in raw  # neither the event name nor the attestation field
    assert raw.rstrip().endswith(b"data: [DONE]")
    first = orjson.loads(raw.split(b"\n\n")[0].removeprefix(b"data: "))
    assert first["choices"][0]["text"] == ""
    assert b'"usage"' not in raw  # asked for by the gateway, not by this client
    [record] = records(stack)
    assert record["verdict"] == "clean" and record["prompt_tokens"] > 0


@pytest.fixture
async def leaky(tiny_model: LoadedModel, keys: Keys) -> AsyncIterator[Stack]:
    async with running_stack(make_backend(tiny_model, keys, leaky=True), keys, "tiny") as s:
        yield s


async def test_a_foreign_block_is_withheld_under_enforce(leaky: Stack) -> None:
    assert (await leaky.post("acme", completion(), path="/v1/completions")).status == 200
    resp = await leaky.post("globex", completion("another prompt " * 6), path="/v1/completions")
    assert resp.status == 502
    assert resp.headers["x-kvfence-verdict"] == "violation"
    assert (await resp.json())["error"]["code"] == "attestation_refused"
    stream = await leaky.post(
        "globex", completion("a third prompt " * 6, stream=True), path="/v1/completions"
    )
    assert stream.status == 502 and stream.content_type == "application/json"
    logged = records(leaky)
    assert [(r["verdict"], r["blocked"]) for r in logged[1:]] == [("violation", True)] * 2
    assert logged[1]["foreign_namespaces"] == [logged[0]["namespace"]]
    assert verify_log(leaky) == 0


async def test_monitor_mode_passes_the_violation_and_records_it(
    tiny_model: LoadedModel,
    keys: Keys,
) -> None:
    backend = make_backend(tiny_model, keys, leaky=True)
    async with running_stack(backend, keys, "tiny", audit="monitor") as stack:
        await stack.post("acme", completion(), path="/v1/completions")
        resp = await stack.post("globex", completion("other " * 20), path="/v1/completions")
        assert resp.status == 200 and resp.headers["x-kvfence-verdict"] == "violation"
        stream = await stack.post(
            "globex", completion("more " * 20, stream=True), path="/v1/completions"
        )
        assert stream.headers["x-kvfence-verdict"] == "violation"
        assert (await stream.read()).rstrip().endswith(b"data: [DONE]")
        logged = records(stack)
        assert [(r["verdict"], r["blocked"]) for r in logged[1:]] == [("violation", False)] * 2


class FakeAttestingBackend:
    """A fake kvfence backend: checks the handle like the real one, then answers with an
    attestation that is `good`, `forged` (an untrusted key), `stale` (another request) or
    `absent`; or a good one misplaced: also `in_body` (a plain answer's JSON), `after_comment`
    (a stream's first event is a comment), `later_event` (after a first text event)."""

    def __init__(self, keys: Keys, mode: str) -> None:
        self.mode = mode
        self.verifier = HandleVerifier(
            TrustStore.from_file(keys.folder / "backend-trust.json"), AUDIENCE
        )
        key = load_private_key(keys.folder / "be.key") if mode != "forged" else generate_key()
        self.signer = AttestationSigner(key, "be", AUDIENCE)
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self.answer)

    def attestation(self, rid: str, ns: str) -> str | None:
        if self.mode == "absent":
            return None
        return self.signer.sign("other" if self.mode == "stale" else rid, ns, 8, 0, [ns])

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = orjson.loads(raw)
        handle = self.verifier.verify(request.headers.get(HANDLE_HEADER), raw)
        handle.check_model(body["model"])
        token = self.attestation(handle.request_id, handle.namespace.value)
        usage = {"prompt_tokens": 8, "completion_tokens": 1, "total_tokens": 9}
        chunk: dict[str, Any] = {"choices": [{"index": 0, "text": "SECRET"}], "usage": usage}
        if not body.get("stream"):
            headers = {ATTESTATION_HEADER: token} if token else {}
            if self.mode == "in_body":
                chunk["choices"][0]["kvfence_attestation"] = token
            return web.json_response(chunk, headers=headers)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        text = b"data: " + orjson.dumps(chunk) + b"\n\n"
        if self.mode == "after_comment":
            await resp.write(b": keep-alive\n\n")
        if self.mode == "later_event":
            await resp.write(text)
        if token:
            head = {"choices": [{"index": 0, "text": ""}], "kvfence_attestation": token}
            await resp.write(b"event: kvfence-attestation\ndata: " + orjson.dumps(head) + b"\n\n")
        await resp.write((b"" if self.mode == "later_event" else text) + b"data: [DONE]\n\n")
        return resp


@pytest.mark.parametrize(
    ("mode", "verdict"), [("forged", "invalid"), ("stale", "mismatch"), ("absent", "missing")]
)
@pytest.mark.parametrize("stream", [False, True], ids=["body", "stream"])
async def test_a_bad_attestation_withholds_every_token(
    keys: Keys, mode: str, verdict: str, stream: bool
) -> None:
    fake = FakeAttestingBackend(keys, mode)
    async with running_stack(fake.app, keys, "tiny") as stack:
        resp = await stack.post("acme", completion(stream=stream), path="/v1/completions")
        text = await resp.text()
        assert resp.status == 502 and "SECRET" not in text
        assert resp.headers["x-kvfence-verdict"] == verdict
        [record] = records(stack)
        assert record["verdict"] == verdict and record["blocked"]


@pytest.mark.parametrize("audit", ["monitor", "enforce"])
@pytest.mark.parametrize("mode", ["in_body", "after_comment", "later_event"])
async def test_an_attestation_in_any_place_never_reaches_the_client(
    keys: Keys, mode: str, audit: str
) -> None:
    fake = FakeAttestingBackend(keys, mode)
    async with running_stack(fake.app, keys, "tiny", audit=audit) as stack:
        body = completion(stream=mode != "in_body")
        resp = await stack.post("acme", body, path="/v1/completions")
        raw = await resp.read()
        assert b"kvfence_attestation" not in raw and b"kvfence-attestation" not in raw
        assert not any(k.lower().startswith("x-kvfence-attestation") for k in resp.headers)
        if audit == "monitor":  # the answer passes, recorded; the attestation does not
            assert resp.status == 200 and b"SECRET" in raw


async def test_a_good_fake_attestation_passes(keys: Keys) -> None:
    fake = FakeAttestingBackend(keys, "good")
    async with running_stack(fake.app, keys, "tiny") as stack:
        resp = await stack.post("acme", completion(stream=True), path="/v1/completions")
        assert resp.status == 200 and b"SECRET" in await resp.read()
        metrics = stack.gateway[METRICS].render().decode()
        assert 'kvfence_gateway_verdicts_total{backend="own",verdict="clean"} 1.0' in metrics


async def test_an_audit_log_that_cannot_be_written_fails_answers_closed(stack: Stack) -> None:
    await stack.gateway[AUDIT_SINK].close()  # every later append fails
    resp = await stack.post("acme", completion(), path="/v1/completions")
    assert resp.status == 502
    assert (await resp.json())["error"]["code"] == "audit_write_failed"
    streamed = await stack.post("acme", completion(stream=True), path="/v1/completions")
    assert streamed.status == 502  # refused before its first byte: its record cannot open
    assert (await streamed.json())["error"]["code"] == "audit_write_failed"
    metrics = stack.gateway[METRICS].render().decode()  # the stream's open and final records
    assert "kvfence_gateway_audit_write_failures_total 3.0" in metrics


async def test_a_client_that_leaves_mid_stream_still_gets_a_record(stack: Stack) -> None:
    body = completion(stream=True, max_tokens=100, ignore_eos=True)
    resp = await stack.post("acme", body, path="/v1/completions")
    assert resp.status == 200
    await resp.content.readline()
    resp.close()
    [record] = await until(lambda: records(stack), what="a record for the abandoned stream")
    assert (record["status"], record["verdict"], record["tenant"]) == (499, "clean", "acme")
    assert verify_log(stack) == 0
