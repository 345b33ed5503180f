"""One request's response side: the one object a relay talks to. Started with the request's
context before it is forwarded, it is fed what the backend answered (a plain answer whole, or a
stream's first event, its events as they arrive and its end), decides through the judge what
the client gets, and settles the answer once (`gateway.audit.settle`).

Invariant: the prompt is recorded in the detective's history before the request is forwarded
and the answer's text right after the answer completes; no byte reaches the client before the
judgement that allows it, nor a stream's first byte before its record is open; `judge` and
`settle` are called from here and nowhere else, and every exchange is settled exactly once,
failures and clients that leave included; every byte handed to the client is counted in the
answer's receipt (when its tenant gets one) before it is settled. An answer that ends without
its usage is charged what it is known to have cost (`estimate`, by the rule in
`gateway.audit.usage`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

from aiohttp import web

from gateway.audit.events import done_at, split_attestation_event, strip_body, strip_events
from gateway.audit.judge import (
    UNATTESTED,
    Answer,
    AuditContext,
    Judgement,
    is_plain_error,
    judge,
)
from gateway.audit.settle import VERDICT_HEADER, open_stream, settle
from gateway.audit.usage import UsageScanner, parse_usage
from gateway.audit.usage import estimate as estimate_tokens
from gateway.errors import (
    AttestationRefused,
    AuditWriteFailed,
    GatewayError,
    HandleRefused,
    UpstreamUnavailable,
    error_body,
    error_event,
)
from gateway.inputs.paths import GENERATES, RESPONSES
from gateway.receipts import draft as receipts
from gateway.state import (
    BODY,
    DROP_USAGE,
    NAMESPACE,
    PUBLIC,
    REQUEST_ID,
    ROUTE,
    RUNTIME,
    TENANT,
    TIMING,
    UPSTREAM_BODY,
    UPSTREAM_HEADERS,
)
from gateway.verify.detective import Observation
from gateway.verify.evidence import counter_trusted, evidence
from gateway.verify.scan import AnswerScan
from gateway.verify.service import VERIFY, Verification
from gateway.verify.shapes import of_request
from gateway.verify.watch import WATCH
from kvfence.receipt import RECEIPT_HEADER

log = logging.getLogger("kvfence.gateway.proxy")
_NONE: Final[frozenset[str]] = frozenset()  # no public part: nearly every request
CLIENT_CLOSED: Final = 499  # the status recorded when the client leaves mid-stream
SHAPE_EVERY: Final = 16  # one request in this many tells the watch its shape
_LEFT: Final = {
    "client_closed": "client closed the connection before its answer ended",
    "client_stalled": "client stopped reading; stream cut",
}


class Exchange:
    """What the response side knows of one request. `attested`: the answer must carry an
    attestation (a stream's first event holds it); `headers`: what the client's answer carries
    beside the backend's (the request id and the verdict), once the head is judged; `first`: a
    stream's first event as the client gets it (its attestation taken out), sent first."""

    __slots__ = (
        "_detective",
        "_done",
        "_observation",
        "_relayed",
        "_request",
        "_scan",
        "_suspect",
        "_timing",
        "_usage",
        "_withheld",
        "answer",
        "attested",
        "body",
        "ctx",
        "first",
        "headers",
        "judgement",
        "receipt",
    )

    def __init__(self, request: web.Request, verification: Verification) -> None:
        self._request = request
        self.receipt = receipts.start(request)
        self._timing = request[TIMING]
        route, parts = request[ROUTE], request.get(PUBLIC, ())
        self.ctx = AuditContext(
            request_id=request[REQUEST_ID],
            tenant=request[TENANT].id,
            model=route.model.name,
            backend=route.backend,
            upstream_id=request[UPSTREAM_HEADERS]["x-request-id"],
            namespace=request[NAMESPACE],
            verifier=request[RUNTIME].attestations.get(route.backend.name),
            health=verification.health.get(route.backend.name),
            now=time.time(),
            public=frozenset(part.namespace for part in parts) if parts else _NONE,
        )
        self.attested = self.ctx.attested
        self.answer = Answer()
        self.judgement = UNATTESTED
        self.headers: dict[str, str] = {}
        self._detective = verification.detective
        self._scan = AnswerScan(verification.markers, request.path, attested=self.attested)
        self._observation: Observation | None = None
        self._usage: UsageScanner | None = None  # a stream's, from its head on
        self.first = b""
        self.body = b""  # a plain answer as the client gets it
        self._suspect = b""  # text that may start a canary marker, held for the next events
        self._done = b""  # `data: [DONE]` and what follows it, held until the answer settles
        self._withheld = False  # a judgement cut the stream
        self._relayed = 0  # stream events handed to the client

    @classmethod
    async def start(cls, request: web.Request) -> Exchange:
        """Before the request is forwarded: its audit context, and (for a backend the detective
        audits) its prompt recorded in the shared history."""
        verification = request.app[VERIFY]
        exchange = cls(request, verification)
        ctx = exchange.ctx
        verify = ctx.backend.verify
        if verify is None or request.path not in GENERATES:
            return exchange
        watch = request.app[WATCH]
        watch.budget.request(ctx.backend.name)
        if hash(ctx.request_id) % SHAPE_EVERY == 0:  # rounds follow the traffic's shapes
            watch.saw(ctx.backend, of_request(request.path, request[BODY], None))
        if verify.detective is not None:
            exchange._observation = await verification.detective.record(
                verify.detective, ctx.tenant, ctx.namespace, ctx.model, request.path, request[BODY]
            )
        return exchange

    @property
    def evidence(self) -> dict[str, object] | None:
        """An external server's verdict's evidence (the last canary round, the detective's
        finding; docs/verify.md, "Evidence"), once judged; None for other backends."""
        ctx = self.ctx
        if ctx.backend.verify is None or ctx.verifier is not None:
            return None
        return evidence(ctx.backend, ctx.health, self.answer.finding, ctx.now)

    def began(self, status: int) -> None:
        """The backend's answer began with `status`. Our backend refusing the gateway's own
        handle is a misconfiguration, answered as such (HandleRefused)."""
        self.answer.status = status
        if self.attested and status in (401, 403):
            log.error("backend refused the handle", extra={"rid": self.ctx.request_id})
            raise HandleRefused(f"backend {self.ctx.backend.name} refused the gateway's handle")

    async def plain(self, body: bytes, attestations: list[str]) -> web.Response | None:
        """A plain answer, whole, before a byte of it is sent: judged and settled. Returns the
        local answer that replaces it when it is withheld, else None (send `body` with
        `headers`)."""
        answer = self.answer
        answer.attestations = list(attestations)
        parsed, usage = parse_usage(body)
        answer.read_usage(usage)
        if not 200 <= answer.status < 300:
            answer.plain_error = is_plain_error(body)
        self._scan.body(body, parsed)
        self.body = strip_body(body, parsed)
        await self._finish()
        self.judgement = judgement = judge(self.ctx, answer)
        if 200 <= answer.status < 300:  # an error answer generated nothing
            self.estimate(sent=True)
        self._set_headers()
        if self.receipt is not None:
            self.receipt.replace(body)  # the client gets these bytes unless settle withholds them
            if isinstance(parsed, dict) and isinstance(parsed.get("id"), str):
                self.receipt.chat_id = parsed["id"]
        return await settle(self._request, self.ctx, answer, judgement, receipt=self.receipt)

    async def head(self, event: bytes | None) -> web.Response | None:
        """A stream's first event (None: it never completed), read only when `attested`.
        Returns the local answer that replaces a withheld stream, else None: the stream goes
        on, with `headers`."""
        first = b""
        if self.attested:
            if event is not None:
                self._timing.first_event = time.perf_counter()
            token, first = split_attestation_event(event) if event is not None else (None, b"")
            self.answer.attestations.append(token)
            self.first = strip_events(first)
        # Usage waits for the judgement when the detective audits the answer: a withheld
        # answer's cached-token count never reaches the client.
        self._usage = UsageScanner(self._request[DROP_USAGE], hold=self._observation is not None)
        self.judgement = judgement = judge(self.ctx, self.answer)
        self._set_headers()
        if judgement.blocked:
            return await settle(
                self._request, self.ctx, self.answer, judgement, receipt=self.receipt
            )
        await open_stream(self._request, self.ctx, self.answer, judgement)  # or nothing is sent
        if first:
            self._scan.events(first)  # as the backend sent it: a second attestation counts
            self._relayed += self.first.count(b"data:")
            self._sent(self.first)
        return None

    def _set_headers(self) -> None:
        self.headers = {
            "x-request-id": self.ctx.request_id,
            VERDICT_HEADER: self.judgement.verdict.value,
        }
        if self.receipt is not None:
            self.headers[RECEIPT_HEADER] = self.receipt.receipt_id

    def _sent(self, data: bytes) -> bytes:
        if self.receipt is not None and data:
            self.receipt.sent(data)
        return data

    def events(self, chunk: bytes) -> bytes:
        """Upstream bytes in; the bytes to send the client now out. Complete events pass once
        scanned; the usage-only event the client did not ask for is dropped; text that may
        start a marker and `[DONE]` wait. Raises AttestationRefused when an event makes the
        answer's verdict one that withholds the rest."""
        assert self._usage is not None, "events follow the head"
        return self._sent(self._relay(self._usage.feed(chunk) if chunk else b""))

    def _relay(self, out: bytes) -> bytes:
        """Complete events from the usage scanner in; the bytes the client may have now out
        (counted in the receipt by the caller, once they are to be sent)."""
        if out:
            if not self._timing.first_event:
                self._timing.first_event = time.perf_counter()
            scan = self._scan
            scan.events(out)
            if scan.markers or scan.late_attestations:
                self.answer.markers, self.answer.late_attestations = (
                    scan.markers,
                    scan.late_attestations,
                )
                self.judgement = judge(self.ctx, self.answer)
                if self.judgement.blocked:  # cut before this chunk reaches the client
                    self._withheld = True
                    raise _refused(self.judgement)
            out = strip_events(out)  # scanned as sent, relayed without any attestation
            # Text that may be the start of a canary marker waits for the next events.
            if scan.marker_started:
                out, self._suspect = b"", self._suspect + out
            elif self._suspect:
                out, self._suspect = self._suspect + out, b""
        if self._done:
            out, self._done = b"", self._done + out
        else:
            cut = done_at(out)
            if cut >= 0:
                out, self._done = out[:cut], out[cut:]
        self._relayed += out.count(b"data:")
        return out

    async def end(self) -> bytes:
        """The backend's stream ended: the whole answer is judged (now with its usage and the
        detective's check) and settled. Returns what was held back, `[DONE]` included; raises
        the GatewayError that ends the stream instead (cut short, withheld, or its record
        lost), settled by then or by `fail`."""
        assert self._usage is not None, "the end follows the head"
        usage, answer = self._usage, self.answer
        last = usage.tail()  # a last event that came without its blank line
        held = usage.held()  # the usage events the detective held: scanned like the rest
        last = self._relay(last)  # sent with the rest, once the whole answer is judged
        if held:
            self._scan.events(held)
            answer.late_attestations = self._scan.late_attestations
            held = strip_events(held)  # scanned as sent, relayed without any attestation
        answer.prompt_tokens, answer.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        answer.total_tokens = usage.total_tokens
        ended = self._scan.terminal if self._request.path == RESPONSES else bool(self._done)
        if not ended:  # whatever the framing claimed, the protocol's last event never came
            raise UpstreamUnavailable(
                "the backend's stream ended without its final event (cut short)"
            )
        await self._finish()
        self.judgement = judge(self.ctx, answer)  # now with the usage and the detective's check
        if self.judgement.blocked:
            raise _refused(self.judgement)
        self.estimate(sent=True)
        rest = self._sent(last + self._suspect + held + self._done)
        # AuditWriteFailed: it ends the stream
        await settle(self._request, self.ctx, answer, self.judgement, receipt=self.receipt)
        return rest

    async def fail(self, error: GatewayError) -> None:
        """The exchange ends with `error` (the upstream failed, or a stream was cut): settled
        with the judgement so far, the status the client got and the error's code, unless it
        was settled already. A record that cannot be written is logged and counted there."""
        if self.answer.settled:
            return
        if self._usage is not None:
            cause = error.cause or "-"
            fields = {"rid": self.ctx.request_id, "error": error.code, "cause": cause}
            log.warning("stream cut", extra=fields)
            if not self._withheld:
                self.answer.prompt_tokens = self._usage.prompt_tokens
            self._sent(error_event(error))  # the event that ends the stream
        elif self.receipt is not None:
            self.receipt.replace(error_body(error))  # the error answer the client gets instead
        self.estimate(sent=bool(self.answer.status))
        with contextlib.suppress(AuditWriteFailed):
            await settle(
                self._request,
                self.ctx,
                self.answer,
                self.judgement,
                status=error.status,
                reason=error.code,
                receipt=self.receipt,
            )

    async def left(self, reason: str) -> None:
        """The client left (`client_closed`) or stopped reading (`client_stalled`), before its
        answer or mid-stream: the answer is settled with status 499 and `reason`, even while the
        handler is being cancelled."""
        if self.answer.settled:
            return
        log.info(_LEFT[reason], extra={"rid": self.ctx.request_id})
        if self._usage is not None:
            self.answer.prompt_tokens = self._usage.prompt_tokens
            self.answer.cached_tokens = self._usage.cached_tokens
        self.estimate(sent=bool(self._timing.upstream_sent))
        left = settle(
            self._request,
            self.ctx,
            self.answer,
            self.judgement,
            status=CLIENT_CLOSED,
            reason=reason,
            receipt=self.receipt,
        )
        with contextlib.suppress(AuditWriteFailed):
            await asyncio.shield(left)

    def estimate(self, sent: bool) -> None:
        """What an answer that ended without its usage is charged (`gateway.audit.usage`): its
        prompt (as the usage or the attestation gave it, else from the body's bytes) once the
        request was `sent` to the backend, and what it generated."""
        answer = self.answer
        if answer.total_tokens is not None:
            return
        if not sent:
            answer.estimated_tokens = self._relayed
            return
        prompt = answer.prompt_tokens
        att = self.judgement.attestation
        if prompt is None and att is not None:
            prompt = att.prompt_tokens
        size, text = len(self._request[UPSTREAM_BODY]), self._scan.text_bytes
        answer.estimated_tokens = estimate_tokens(prompt, size, text, self._relayed)

    async def _finish(self) -> None:
        """The answer is complete: the detective judges its reported hit and records its text
        (before the client can have it, so its next turn finds it)."""
        answer, obs = self.answer, self._observation
        answer.markers = self._scan.markers
        if obs is None or answer.status != 200:
            return
        trusted = counter_trusted(self.ctx.backend, self.ctx.health)
        answer.finding = await self._detective.judge(
            obs, answer.prompt_tokens, answer.cached_tokens, trusted
        )
        text = self._scan.text
        if text:
            await self._detective.record_answer(obs, text)


def _refused(judgement: Judgement) -> AttestationRefused:
    what = f"its audit verdict is {judgement.verdict.value}"
    return AttestationRefused(f"the rest of the answer was withheld: {what}")
