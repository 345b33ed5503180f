"""Exchanges and answer steps built from bytes, without aiohttp: a context for a backend of
each kind, a ledger that keeps what it was asked to settle, and drivers that feed a stream's
bytes in (cut where a test says) and collect the bytes the client would get."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from gateway.audit import sse
from gateway.audit.answer.step import Do, Step
from gateway.audit.answer.usage import Usage
from gateway.audit.context import AnswerContext
from gateway.audit.exchange import Exchange
from gateway.audit.judge import Answer, AuditContext, Judgement
from gateway.audit.replies import Opened, Withheld, withheld
from gateway.errors import AuditWriteFailed, GatewayError
from gateway.inputs.paths import CHAT
from gateway.policy.backend_model import (
    AuditMode,
    Backend,
    KvfenceOptions,
    ModelSpec,
    VerifySettings,
)
from gateway.policy.secrets import SecretRef
from gateway.state import Timing
from gateway.verify.detective import Detective
from gateway.verify.markers import MarkerKey
from gateway.verify.store import FingerprintStore
from kvfence.attestation import AttestationSigner, AttestationVerifier
from kvfence.keys.keyfile import TrustStore, generate_key

KEY = MarkerKey(b"k" * 32)  # the canary marker key of every kit context
SIGNING = generate_key()
TRUST = TrustStore({"be": SIGNING.public_key()})
SIGNER = AttestationSigner(SIGNING, "be", "backend-1")
NS = "ns1.tenant-a"
UPSTREAM_ID = "rid.up"


@dataclass
class Ledger:
    """Keeps what the exchange settled; withholds what a blocked judgement withholds; `lost`:
    what settling raises once it kept it (a record or a receipt that could not be stored)."""

    opened: list[Judgement] = field(default_factory=list)
    settled: list[tuple[Judgement, int | None, str | None]] = field(default_factory=list)
    lost: AuditWriteFailed | None = None

    async def open(self, answer: Answer, judgement: Judgement) -> None:
        self.opened.append(judgement)

    async def settle(
        self, answer: Answer, judgement: Judgement, status: int | None, reason: str | None
    ) -> Withheld | None:
        assert not answer.settled, "an answer is settled once"
        answer.settled = True
        self.settled.append((judgement, status, reason))
        if self.lost is not None:
            raise self.lost
        return withheld(judgement, "rid", None) if judgement.blocked else None


def backend(kind: str = "plain", mode: AuditMode = AuditMode.ENFORCE) -> Backend:
    """`plain`: an unscoped server; `kvfence`: ours (it attests); `watched`: an external
    scoped server whose answers the detective checks (canaries off)."""
    options = KvfenceOptions("backend-1", SecretRef("file", "t.json"), TRUST)
    verify = VerifySettings(canary=None) if kind == "watched" else None
    return Backend("b", "kvfence" if kind == "kvfence" else "vllm", "http://b",
                   (ModelSpec("m", "1"),), kvfence=options if kind == "kvfence" else None,
                   audit=mode, verify=verify)  # fmt: skip


def context(
    kind: str = "plain",
    *,
    path: str = CHAT,
    usage_asked: bool = True,
    mode: AuditMode = AuditMode.ENFORCE,
    history: Path | None = None,
    body: dict[str, Any] | None = None,
) -> AnswerContext:
    """An exchange's context for a backend of `kind` (`backend`); `history`: where a `watched`
    backend's detective keeps its history file."""
    verifier = AttestationVerifier(TRUST, "backend-1") if kind == "kvfence" else None
    audit = AuditContext("rid", "acme", "m", backend(kind, mode), UPSTREAM_ID, NS, verifier)
    store = FingerprintStore(history, 1 << 12, 1 << 10) if history is not None else None
    watch = SimpleNamespace(budget=SimpleNamespace(request=lambda name: None),
                            saw=lambda backend, shape: None)  # fmt: skip
    return AnswerContext(
        audit=audit,
        path=path,
        body=body or {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        sent_bytes=64,
        usage_asked=usage_asked,
        markers=KEY,
        detective=Detective(store, b"s" * 32) if store is not None else None,  # type: ignore[arg-type]
        watch=watch,  # type: ignore[arg-type]
        timing=Timing(start=0.0, upstream_sent=1.0),
        receipt=None,
        ledger=Ledger(),
    )


def attestation_event(cached: int = 0, prompt: int = 12) -> bytes:
    """Our backend's first event: its attestation of this kit's request."""
    token = SIGNER.sign(UPSTREAM_ID, NS, prompt, cached, (NS,))
    return (
        b'event: kvfence-attestation\ndata: {"kvfence_attestation":"' + token.encode() + b'"}\n\n'
    )


def cuts(stream: bytes, at: Sequence[int]) -> list[bytes]:
    """`stream` cut at the offsets `at` (in any order; out of range ones wrap)."""
    points = sorted({c % (len(stream) + 1) for c in at} | {0, len(stream)})
    return [stream[a:b] for a, b in itertools.pairwise(points)]


@dataclass
class Run:
    """What the client got of one stream, and how the exchange ended."""

    exchange: Exchange
    ledger: Ledger
    head: Opened | Withheld
    sent: bytes = b""
    error: GatewayError | None = None

    @property
    def answer(self) -> Answer:
        return self.exchange.answer


async def exchange_from_bytes(
    chunks: Sequence[bytes], ctx: AnswerContext | None = None, first: bytes | None = None
) -> Run:
    """A stream relayed as `gateway.relay.stream` relays it: `first` (an attested stream's
    first event), then `chunks` as they arrive, then the end."""
    ctx = ctx or context()
    exchange = await Exchange.start(ctx)
    exchange.began(200)
    head = await exchange.head(first if ctx.audit.attested else None)
    assert isinstance(ctx.ledger, Ledger)
    run = Run(exchange, ctx.ledger, head)
    if isinstance(head, Withheld):
        return run
    run.sent = head.first
    try:
        for chunk in chunks:
            run.sent += exchange.events(chunk)
        run.sent += await exchange.end()
    except GatewayError as error:
        run.error = await exchange.fail(error)
    return run


def through(step: Step, raws: Sequence[bytes]) -> bytes:
    """Complete events through one step alone, then its end: the bytes it lets go on."""
    out: list[bytes] = []
    for raw in raws:
        for event in sse.events(raw):
            out += _passed(step.see(event))
    out += [event.raw for event in step.finish()]
    return b"".join(out)


def _passed(seen: sse.Event | tuple[sse.Event, ...] | Do) -> list[bytes]:
    if isinstance(seen, sse.Event):
        return [seen.raw]
    if isinstance(seen, Do):
        return []
    return [event.raw for event in seen]


class UsageScanner:
    """The usage step fed a stream's chunks, framed as the exchange frames them: what it lets
    go on, what it holds (`held`), and the usage it read."""

    def __init__(self, drop_usage: bool, hold: bool = False) -> None:
        ctx = context("watched" if hold else "plain", usage_asked=not drop_usage)
        self._step = Usage(ctx)
        self._reader = sse.Reader()

    def feed(self, chunk: bytes) -> bytes:
        return self._pass(self._reader.feed(chunk))

    def tail(self) -> bytes:
        return self._pass(self._reader.end())

    def held(self) -> bytes:
        return b"".join(event.raw for event in self._step.finish())

    def _pass(self, complete: bytes) -> bytes:
        return b"".join(b"".join(_passed(self._step.see(e))) for e in sse.events(complete))

    @property
    def prompt_tokens(self) -> int | None:
        return self._step.prompt_tokens

    @property
    def cached_tokens(self) -> int | None:
        return self._step.cached_tokens

    @property
    def total_tokens(self) -> int | None:
        return self._step.total_tokens
