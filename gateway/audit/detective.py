"""The detective's part of one exchange (`gateway.verify.detective`): the prompt recorded in the
shared history before the request is forwarded; once the answer is complete, its reported hit
judged and its text recorded, before the client can have it (so its next turn finds it).

Invariant: only for a backend the detective audits, and only on the paths that generate; the
watch hears of the request (its budget, one shape in `SHAPE_EVERY`) before it is forwarded.
"""

from __future__ import annotations

from typing import Final

from gateway.audit.context import AnswerContext
from gateway.audit.judge import Answer
from gateway.inputs.paths import GENERATES
from gateway.verify.detective import Observation
from gateway.verify.evidence import counter_trusted
from gateway.verify.shapes import of_request

SHAPE_EVERY: Final = 16  # one request in this many tells the watch its shape


async def recorded(ctx: AnswerContext) -> Observation | None:
    """Before the request is forwarded: its prompt in the history (None: not audited so)."""
    audit = ctx.audit
    verify = audit.backend.verify
    if verify is None or ctx.path not in GENERATES:
        return None
    ctx.watch.budget.request(audit.backend.name)
    if hash(audit.request_id) % SHAPE_EVERY == 0:  # rounds follow the traffic's shapes
        ctx.watch.saw(audit.backend, of_request(ctx.path, ctx.body, None))
    if verify.detective is None:
        return None
    return await ctx.detective.record(
        verify.detective, audit.tenant, audit.namespace, audit.model, ctx.path, ctx.body
    )


async def judged(
    ctx: AnswerContext, obs: Observation | None, answer: Answer, text: str | None
) -> None:
    """The complete answer: who explains its reported hit (`answer.finding`), and its `text`
    (None: not kept) recorded after the prompt."""
    if obs is None or answer.status != 200:
        return
    trusted = counter_trusted(ctx.audit.backend, ctx.audit.health)
    answer.finding = await ctx.detective.judge(
        obs, answer.prompt_tokens, answer.cached_tokens, trusted
    )
    if text:
        await ctx.detective.record_answer(obs, text)
