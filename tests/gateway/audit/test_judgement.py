"""The audit judges every answer of our backend kind: any status, every attestation occurrence,
every stream event that can carry one, and whether the attestation accounts for the cached tokens
the answer reports. A fake backend (real aiohttp on port 0, checking handles like ours) answers
each way an attacker or a bug could."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from multidict import CIMultiDict

from kvfence.attestation import ATTESTATION_HEADER, AttestationSigner
from kvfence.handle import HANDLE_HEADER, HandleVerifier
from kvfence.keys.keyfile import TrustStore, load_private_key
from tests.kit.stack import AUDIENCE, Keys, make_keys, running_stack

SECRET = "SECRET-TEXT"


class Backend:
    def __init__(self, keys: Keys, mode: str) -> None:
        self.mode = mode
        trust = TrustStore.from_file(keys.folder / "backend-trust.json")
        self.verifier = HandleVerifier(trust, AUDIENCE)
        self.signer = AttestationSigner(load_private_key(keys.folder / "be.key"), "be", AUDIENCE)
        self.app = web.Application()
        self.app.router.add_post("/v1/completions", self.answer)

    async def answer(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        handle = self.verifier.verify(request.headers.get(HANDLE_HEADER), raw)
        rid, ns = handle.request_id, handle.namespace.value
        cached = 16 if self.mode in ("empty_blocks", "usage_mismatch") else 0
        blocks = [] if self.mode == "empty_blocks" else [ns]
        token = self.signer.sign(
            rid, ns, 32, 0 if self.mode == "usage_mismatch" else cached, blocks
        )
        usage = {"prompt_tokens": 32, "completion_tokens": 1, "total_tokens": 33,
                 "prompt_tokens_details": {"cached_tokens": cached}}  # fmt: skip
        chunk: dict[str, Any] = {"choices": [{"index": 0, "text": SECRET}], "usage": usage}
        if self.mode == "status_201":
            return web.json_response(chunk, status=201)
        if self.mode == "error_leaky":
            return web.json_response(chunk, status=500)
        if self.mode == "error_plain":
            return web.json_response({"error": {"message": "busy", "code": "x"}}, status=503)
        if not orjson.loads(raw).get("stream"):
            headers = CIMultiDict([(ATTESTATION_HEADER, token)])
            if self.mode == "duplicate":
                headers.add(ATTESTATION_HEADER, token)
            return web.json_response(chunk, headers=headers)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        head = {"choices": [{"index": 0, "text": ""}], "kvfence_attestation": token}
        await resp.write(b"event: kvfence-attestation\ndata: " + orjson.dumps(head) + b"\n\n")
        if self.mode == "late":
            await resp.write(b"event: kvfence-attestation\ndata: " + orjson.dumps(head) + b"\n\n")
        text = {"choices": [{"index": 0, "text": SECRET}]}
        end = {"choices": [], "usage": usage}
        await resp.write(b"data: " + orjson.dumps(text) + b"\n\n")
        await resp.write(b"data: " + orjson.dumps(end) + b"\n\ndata: [DONE]\n\n")
        return resp


# (mode, streamed, what the client sees, the verdict recorded)
CASES = [
    ("status_201", False, 502, "missing"),
    ("error_leaky", False, 502, "missing"),
    ("error_plain", False, 503, "unattested"),
    ("duplicate", False, 502, "invalid"),
    ("empty_blocks", False, 502, "mismatch"),
    ("usage_mismatch", False, 502, "mismatch"),
    ("late", True, "cut", "invalid"),
    ("usage_mismatch", True, "cut", "mismatch"),
]


@pytest.mark.parametrize(("mode", "stream", "seen", "verdict"), CASES)
async def test_every_answer_is_judged(
    tmp_path: Path, mode: str, stream: bool, seen: int | str, verdict: str
) -> None:
    keys = make_keys(tmp_path)
    fake = Backend(keys, mode)
    async with running_stack(fake.app, keys, "tiny") as stack:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 1, "stream": stream}
        resp = await stack.post("acme", body, path="/v1/completions")
        raw = await resp.read()
        if seen == "cut":  # headers went out clean; the rest is an error event, no [DONE]
            assert resp.status == 200 and b"event: error" in raw and b"[DONE]" not in raw
            if mode == "late":  # the second attestation came before the text: none was sent
                assert SECRET.encode() not in raw
        else:
            assert resp.status == seen
            assert SECRET.encode() not in raw
        rows = [orjson.loads(line) for line in stack.audit_log.read_bytes().splitlines()]
        [record] = [r for r in rows if r.get("kind") == "record" and r.get("phase") != "open"]
        assert record["verdict"] == verdict
