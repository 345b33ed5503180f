"""One exchange with an upstream, as the response side sees it: the audit context, what came
back (`Answer`), the scan of the answer's text, and the detective's record of the prompt.

Invariant: the prompt is recorded in the shared history before the request is forwarded, and
the answer's text right after the answer completes, so the next turn always finds both.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from gateway.audit.judge import Answer, AuditContext
from gateway.audit.settle import audit_context
from gateway.state import BODY, VERIFY
from gateway.verify.detective import Detective, Observation
from gateway.verify.scan import AnswerScan


@dataclass(slots=True)
class Exchange:
    ctx: AuditContext
    answer: Answer
    scan: AnswerScan
    detective: Detective
    observation: Observation | None = None

    @classmethod
    async def start(cls, request: web.Request) -> Exchange:
        ctx = audit_context(request)
        verification = request.app[VERIFY]
        scan = AnswerScan(verification.markers, request.path, attested=ctx.attested)
        exchange = cls(ctx, Answer(), scan, verification.detective)
        settings = ctx.backend.verify.detective if ctx.backend.verify else None
        if settings is not None:
            exchange.observation = await verification.detective.record(
                settings, ctx.namespace, request.path, request[BODY]
            )
        return exchange

    def finish(self) -> None:
        """The answer is complete: judge its reported hit, and record its text."""
        answer, obs = self.answer, self.observation
        answer.markers = self.scan.markers
        if obs is None or answer.status != 200:
            return
        answer.detective = self.detective.judge(obs, answer.prompt_tokens, answer.cached_tokens)
        text = self.scan.text
        if text:
            self.detective.record_answer(obs, text)
