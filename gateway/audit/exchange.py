"""One request's response side, the one object a relay talks to: built from the request's
context, fed what the backend answered, it passes a stream's events through `ANSWER`, judges,
settles once through its ledger, and returns what the relay sends.

Invariant: no byte reaches the client before the judgement that allows it, nor a stream's
first byte before its record is open; `judge` and the ledger are called from here only; every
exchange is settled exactly once; every byte handed to the client is counted in its receipt
first; an answer without usage is charged an estimate (`gateway.audit.usage`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final

from gateway import errors
from gateway.audit.answer.attestation import Attestation
from gateway.audit.answer.done import Done
from gateway.audit.answer.fingerprint import Fingerprint
from gateway.audit.answer.markers import Markers
from gateway.audit.answer.pipe import Pipe
from gateway.audit.answer.step import Step
from gateway.audit.answer.usage import Usage
from gateway.audit.context import AnswerContext
from gateway.audit.detective import judged, recorded
from gateway.audit.events import strip_body
from gateway.audit.judge import UNATTESTED, Answer, is_plain_error, judge
from gateway.audit.replies import Opened, Plain, Withheld, cut, headers
from gateway.audit.usage import parse_usage
from gateway.errors import AuditWriteFailed, GatewayError, HandleRefused, ReceiptUnavailable
from gateway.verify.detective import Observation

# A stream's events pass these steps in this order (`gateway.audit.answer.step`).
ANSWER: Final[tuple[Callable[[AnswerContext], Step], ...]] = (
    Fingerprint, Usage, Attestation, Markers, Done
)  # fmt: skip
log = logging.getLogger("kvfence.gateway.proxy")


class Exchange:
    __slots__ = ("_attestation", "_ctx", "_done", "_markers", "_observation", "_pipe",
                 "_relayed", "_streamed", "_usage", "_withheld", "answer", "judgement")  # fmt: skip

    def __init__(self, ctx: AnswerContext) -> None:
        self._ctx, self.answer, self.judgement = ctx, Answer(), UNATTESTED
        self._observation: Observation | None = None
        self._pipe = pipe = Pipe(tuple(step(ctx) for step in ANSWER))
        self._usage, self._attestation = pipe.find(Usage), pipe.find(Attestation)
        self._markers, self._done = pipe.find(Markers), pipe.find(Done)
        self._streamed = self._withheld = False  # a stream's head was read; a judgement cut it
        self._relayed = 0  # stream events handed to the client

    @classmethod
    async def start(cls, ctx: AnswerContext) -> Exchange:
        """Before the request is forwarded (`gateway.audit.detective.recorded`)."""
        (exchange := cls(ctx))._observation = await recorded(ctx)
        return exchange

    def began(self, status: int) -> None:
        """The answer began with `status`; our backend refusing our handle: HandleRefused."""
        self.answer.status, audit = status, self._ctx.audit
        if audit.attested and status in (401, 403):
            log.error("backend refused the handle", extra={"rid": audit.request_id})
            raise HandleRefused(f"backend {audit.backend.name} refused the gateway's handle")

    async def plain(self, body: bytes, attestations: list[str]) -> Plain | Withheld:
        """A plain answer, whole, judged and settled before a byte of it is sent."""
        answer, receipt = self.answer, self._ctx.receipt
        answer.attestations = list(attestations)
        parsed, usage = parse_usage(body)
        answer.read_usage(usage)
        if not 200 <= answer.status < 300:
            answer.plain_error = is_plain_error(body)
        self._markers.scan.body(body, parsed)
        await self._finish()
        self.judgement = judge(self._ctx.audit, answer)
        if 200 <= answer.status < 300:  # an error answer generated nothing
            self._estimate(sent=True)
        if receipt is not None:
            receipt.plain(body, parsed)  # the client gets these bytes unless they are withheld
        return await self._settle() or Plain(self._head(), strip_body(body, parsed))

    async def head(self, event: bytes | None) -> Opened | Withheld:
        """A stream's first event (None: it never completed; read only when attested): judged,
        and the stream's record opened, before the stream goes on."""
        self._streamed, first = True, b""
        if self._ctx.audit.attested:
            if event is not None:
                self._ctx.timing.first_event = time.perf_counter()
            token, first = self._attestation.first(event) if event is not None else (None, b"")
            self.answer.attestations.append(token)
        self.judgement = judge(self._ctx.audit, self.answer)
        if self.judgement.blocked and (withheld := await self._settle()) is not None:
            return withheld
        await self._ctx.ledger.open(self.answer, self.judgement)  # or nothing is sent
        return Opened(self._head(), self._sent(self._relay(first, check=False)))

    def events(self, chunk: bytes) -> bytes:
        """Upstream bytes in; what the client gets now out (AttestationRefused: cut)."""
        return self._sent(self._relay(self._pipe.complete(chunk)))

    async def end(self) -> bytes:
        """The stream ended: the whole answer judged (with its usage and the detective's check)
        and settled. Returns what was held back, its ending event (`[DONE]`) last; raises the
        GatewayError that ends the stream instead (cut short, withheld, its record or its
        receipt lost)."""
        answer, usage = self.answer, self._usage
        rest = self._relay(self._pipe.tail()) + self._pipe.flush()
        answer.late_attestations = self._attestation.late
        answer.prompt_tokens, answer.cached_tokens = usage.prompt_tokens, usage.cached_tokens
        answer.total_tokens = usage.total_tokens
        if not self._done.ended:  # whatever the framing claimed, the last event never came
            cause = "the backend's stream ended without its final event (cut short)"
            raise errors.UpstreamUnavailable(cause)
        await self._finish()
        self.judgement = judge(self._ctx.audit, answer)  # with the usage and the detective's
        if self.judgement.blocked:
            raise cut(self.judgement)
        self._estimate(sent=True)
        rest = self._sent(rest)
        await self._settle()  # AuditWriteFailed (ReceiptUnavailable): it ends the stream
        return rest

    async def fail(self, error: GatewayError) -> GatewayError:
        """It ends with `error`: settled (once) with the judgement so far and the error. Returns
        the error a begun stream ends with: `error`, or ReceiptUnavailable when the receipt its
        head named could not be stored."""
        if self.answer.settled:
            return error
        if self._streamed:
            fields = {"rid": self._ctx.audit.request_id, "error": error.code}
            log.warning("stream cut", extra=fields | {"cause": error.cause or "-"})
            if not self._withheld:
                self.answer.prompt_tokens = self._usage.prompt_tokens
            self._sent(errors.error_event(error))  # the event that ends the stream
        elif self._ctx.receipt is not None:
            self._ctx.receipt.replace(errors.error_body(error))  # the error the client gets instead
        self._estimate(sent=bool(self.answer.status))
        try:
            await self._settle(error.status, error.code)
        except ReceiptUnavailable as unstored:  # the client holds its id: it hears this instead
            return unstored
        except AuditWriteFailed:  # logged and counted by the ledger
            pass
        return error

    async def left(self, reason: str) -> None:
        """The client left (`client_closed`) or stopped reading (`client_stalled`): settled
        with status 499 and `reason`, even while the handler is being cancelled."""
        if self.answer.settled:
            return
        stalled = reason == "client_stalled"
        what = "client stopped reading; stream cut" if stalled else "client closed the connection"
        log.info(what, extra={"rid": self._ctx.audit.request_id})
        if self._streamed:
            self.answer.prompt_tokens = self._usage.prompt_tokens
            self.answer.cached_tokens = self._usage.cached_tokens
        self._estimate(sent=bool(self._ctx.timing.upstream_sent))
        with contextlib.suppress(AuditWriteFailed):
            await asyncio.shield(self._settle(errors.CLIENT_CLOSED, reason))

    def _head(self) -> dict[str, str]:
        return headers(self._ctx.audit.request_id, self.judgement, self._ctx.receipt)

    async def _settle(self, status: int | None = None, why: str | None = None) -> Withheld | None:
        return await self._ctx.ledger.settle(self.answer, self.judgement, status, why)

    def _relay(self, events: bytes, check: bool = True) -> bytes:
        """Complete events in; what the client may have of them now out (counted as relayed,
        not yet in the receipt). A marker or a late attestation is judged first."""
        if not events:
            return b""
        if not self._ctx.timing.first_event:
            self._ctx.timing.first_event = time.perf_counter()
        out = self._pipe.flow(events)
        markers, late = self._markers.scan.markers, self._attestation.late
        if check and (markers or late):
            self.answer.markers, self.answer.late_attestations = markers, late
            self.judgement = judge(self._ctx.audit, self.answer)
            if self.judgement.blocked:  # cut before these events reach the client
                self._withheld = True
                raise cut(self.judgement)
        self._relayed += out.count(b"data:")
        return out

    def _sent(self, data: bytes) -> bytes:
        if self._ctx.receipt is not None and data:
            self._ctx.receipt.sent(data)
        return data

    def _estimate(self, sent: bool) -> None:
        att, text = self.judgement.attestation, self._markers.scan.text_bytes
        self.answer.charge(att, sent, self._ctx.sent_bytes, text, self._relayed)

    async def _finish(self) -> None:
        self.answer.markers = self._markers.scan.markers
        await judged(self._ctx, self._observation, self.answer, self._markers.scan.text)
