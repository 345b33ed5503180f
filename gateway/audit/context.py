"""What one exchange is built from: everything it needs of its request, read once by the relay
before the request is forwarded, and where it settles (`Ledger`).

Invariant: frozen, and free of aiohttp: an exchange built from it runs without a request, so
tests build one from bytes (`tests.kit.answer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from gateway.audit.judge import Answer, AuditContext, Judgement
from gateway.audit.replies import Withheld
from gateway.inputs.paths import GENERATES
from gateway.receipts.draft import Draft
from gateway.state import Timing
from gateway.verify.detective import Detective
from gateway.verify.markers import MarkerKey
from gateway.verify.watch import Watch


class Ledger(Protocol):
    """Where an exchange is settled (`gateway.audit.settle.Books`)."""

    async def open(self, answer: Answer, judgement: Judgement) -> None:
        """A stream's record, before its first byte."""
        ...

    async def settle(
        self, answer: Answer, judgement: Judgement, status: int | None, reason: str | None
    ) -> Withheld | None:
        """The answer's final record (and receipt); the refusal when it is withheld."""
        ...


@dataclass(frozen=True, slots=True)
class AnswerContext:
    audit: AuditContext
    path: str
    body: dict[str, Any]  # the request as scoped (the detective's prompt, the watch's shape)
    sent_bytes: int  # the size of the body forwarded (what an answer without usage is charged)
    usage_asked: bool  # the client gets usage (`gateway.inputs.stream_options`)
    markers: MarkerKey | None
    detective: Detective
    watch: Watch
    timing: Timing
    receipt: Draft | None  # None: this tenant gets no receipt
    ledger: Ledger

    @property
    def observed(self) -> bool:
        """The detective records this prompt and judges its answer's reported hit."""
        verify = self.audit.backend.verify
        return verify is not None and verify.detective is not None and self.path in GENERATES
