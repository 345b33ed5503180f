"""The detective audit of one answer: record the request's prompt-prefix keys (with its tenant
and namespace) before it is forwarded, and afterwards say who explains the cached tokens the
server reported: the namespace's own records, another namespace's, or nobody's.

Invariant: a hit is `violation` only when another namespace's records explain it and the
namespace's own do not (whatever the history's age); a hit nobody explains, or a count that is
not a prefix-cache hit count, is `unexplained`; neither ever quarantines by itself (a canary
round shaped like the request decides that).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from gateway import entropy
from gateway.fleet.unavailable import SharedUnavailable
from gateway.policy.backend_model import DetectiveSettings
from gateway.verify import fingerprints as fp
from gateway.verify.history import History, Presence, Recorder
from gateway.verify.tokens import ChatTokenizer, TokenizerError
from kvfence.verdict import Verdict

log = logging.getLogger("kvfence.gateway.detective")

# Why a hit is not explained by its own namespace (the `reason` of a finding; docs/verify.md).
OWN: Final = "own"
ATTRIBUTED: Final = "attributed"  # another namespace's records explain it: a foreign hit
NOBODY: Final = "nobody"  # no namespace's records explain it
NOT_BLOCKS: Final = "not_blocks"  # exact mode: the count is not whole cache blocks
UNTRUSTED: Final = "counter_untrusted"  # a canary round saw the counter report cold hits
NO_HISTORY: Final = "history_unavailable"  # the shared history could not be reached
OTHER_FORM: Final = "other_form"  # bound mode: the namespace also sent prompts in a form it
# cannot relate to this one (token ids, a rendered template), which may hold these tokens


@dataclass(slots=True)
class Observation:
    """What the detective keeps of one request between forwarding and judging."""

    settings: DetectiveSettings
    model: str
    who: Recorder
    nonce: int
    stream: bytes
    bound: fp.Fingerprints
    hashed: hashlib.blake2b  # the bound hasher after the whole prompt: the answer's keys go on
    before: list[bool]
    exact: fp.Fingerprints | None = None
    exact_ids: list[int] | None = None
    exact_before: list[bool] | None = None
    other_forms: tuple[int, ...] = ()  # the keys of the forms this prompt did not come in


@dataclass(frozen=True, slots=True)
class Finding:
    """The detective's explanation of one answer's reported hit, in the stable form the audit
    record and the exchange's evidence carry (docs/verify.md, "Evidence")."""

    verdict: Verdict | None  # None: explained, or nothing to explain; else UNEXPLAINED/VIOLATION
    reason: str  # OWN, ATTRIBUTED, NOBODY, NOT_BLOCKS, UNTRUSTED, or "" (no hit reported)
    cached_tokens: int = 0
    own_tokens: int = 0  # what the namespace's own records explain
    any_tokens: int = 0  # what every namespace's records together explain
    other: str = ""  # the label prefix of a namespace whose records explain the hit
    mode: str = "bound"  # "exact" or "bound"

    def as_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value if self.verdict else None,
            "explained_by": {OWN: "own", ATTRIBUTED: "other"}.get(self.reason, "none"),
            "reason": self.reason,
            "cached_tokens": self.cached_tokens,
            "own_tokens": self.own_tokens,
            "any_tokens": self.any_tokens,
            "other_namespace": self.other,
            "mode": self.mode,
        }


NO_HIT: Final = Finding(None, "")
RECORDERS_KEPT: Final = 4096  # (tenant, namespace) tags kept; past that the memo starts over


class Detective:
    """One per worker, over the history every worker (and, shared, every replica) uses."""

    def __init__(self, history: History, secret: bytes) -> None:
        self.history = history
        self._secret = secret
        self._tokenizers: dict[Path, ChatTokenizer] = {}
        self._unloadable: set[Path] = set()
        self._recorders: dict[tuple[str, str], Recorder] = {}

    def preload(self, folders: Iterable[Path]) -> None:
        """Load the tokenizers a policy names when the worker starts, so none is first loaded
        inside a request (the command line refused to start with one that cannot be)."""
        for folder in folders:
            self._tokenizer(folder)

    def _tokenizer(self, folder: Path) -> ChatTokenizer | None:
        """The loaded tokenizer; None (bound mode) for one that could not be loaded."""
        found = self._tokenizers.get(folder)
        if found is None and folder not in self._unloadable:
            try:
                found = self._tokenizers[folder] = ChatTokenizer(folder)
            except TokenizerError as exc:
                self._unloadable.add(folder)
                log.error("detective: bound mode for %s: %s", folder, exc)
        return found

    def recorder(self, tenant: str, namespace: str) -> Recorder:
        found = self._recorders.get((tenant, namespace))
        if found is None:
            if len(self._recorders) >= RECORDERS_KEPT:
                self._recorders.clear()
            digest = hashlib.blake2b(
                tenant.encode(), key=self._secret[:64], digest_size=8, person=b"kvfence-tenant"
            ).digest()
            found = Recorder(int.from_bytes(digest, "big") or 1, fp.namespace_tag(namespace))
            self._recorders[tenant, namespace] = found
        return found

    async def record(
        self,
        settings: DetectiveSettings,
        tenant: str,
        namespace: str,
        model: str,
        path: str,
        body: dict[str, Any],
    ) -> Observation:
        """Fingerprint and record the prompt (before the request is forwarded)."""
        stream, starts = fp.prompt_stream(path, body)
        positions = fp.checkpoints(stream)
        hashed = fp.bound_hasher(self._secret, model)
        keys = fp.extend_keys(hashed, stream, 0, positions)
        bound = fp.Fingerprints(tuple(keys), tuple(positions), len(stream), False, starts)
        who = self.recorder(tenant, namespace)
        obs = Observation(settings, model, who, entropy.nonce32(), stream, bound, hashed, [])
        tokenizer = self._tokenizer(settings.tokenizer) if settings.tokenizer else None
        if tokenizer is not None:
            ids = await asyncio.to_thread(tokenizer.prompt_ids, path, body)
            if ids is not None:
                blocks = fp.block_keys(self._secret, model, ids, settings.block_size)
                ends = tuple(range(settings.block_size, len(ids) + 1, settings.block_size))
                obs.exact = fp.Fingerprints(tuple(blocks), ends, len(ids), True)
                obs.exact_ids = ids
        forms = fp.family_keys(self._secret, model)
        mine = fp.family(path, body)
        obs.other_forms = tuple(k for name, k in forms.items() if name != mine)
        every = list(keys) + (list(obs.exact.keys) if obs.exact else []) + [forms[mine]]
        try:
            before = await self.history.record(who, every, obs.nonce)
        except SharedUnavailable:  # nothing recorded: the judgement looks again, or says so
            before = [False] * len(every)
        obs.before = before[: len(keys)]
        if obs.exact is not None:
            obs.exact_before = before[len(keys) : -1]
        return obs

    async def record_answer(self, obs: Observation, text: str) -> None:
        """Record the prompt followed by the answer's text: the next turn of the conversation
        starts with both, and the server cached the answer's blocks too."""
        if not text:
            return
        longer = obs.stream + fp.assistant_turn(text)
        positions = fp.checkpoints(longer, start=obs.bound.total)
        keys = fp.extend_keys(obs.hashed.copy(), longer, obs.bound.total, positions)
        folder = obs.settings.tokenizer
        tokenizer = self._tokenizer(folder) if folder is not None else None
        if tokenizer is not None and obs.exact_ids is not None:
            more = tokenizer.text_ids(text, False)
            size = obs.settings.block_size
            blocks = fp.block_keys(self._secret, obs.model, obs.exact_ids + more, size)
            keys += blocks[len(obs.exact.keys) if obs.exact else 0 :]
        with contextlib.suppress(SharedUnavailable):  # counted and logged by the store
            await self.history.record(obs.who, keys, obs.nonce)

    async def judge(
        self, obs: Observation, prompt_tokens: int | None, cached: int | None, trusted: bool
    ) -> Finding:
        """Who explains the reported hit. `trusted`: no canary round has seen this backend's
        counter report hits on cold requests (then a count proves nothing)."""
        if not cached:
            return NO_HIT
        if not trusted:
            return Finding(None, UNTRUSTED, cached)
        s = obs.settings
        if (
            obs.exact is not None
            and obs.exact_before is not None
            and prompt_tokens == obs.exact.total
        ):
            if cached % s.block_size:
                return Finding(Verdict.UNEXPLAINED, NOT_BLOCKS, cached, mode="exact")
            found, before, extra = obs.exact, obs.exact_before, (0, 0)
        else:
            found, before = obs.bound, obs.before
            extra = (s.template_overhead_tokens, s.message_overhead_tokens)
        mode = "exact" if found.exact else "bound"
        own = fp.explained_tokens(found, before, *extra)
        if cached <= own:  # the snapshot taken when it was recorded says so: no look-up
            return Finding(None, OWN, cached, own, own, mode=mode)
        try:
            seen = await self.history.presence(obs.who, found.keys, obs.nonce, before)
        except SharedUnavailable:
            return Finding(Verdict.UNEXPLAINED, NO_HISTORY, cached, own, own, mode=mode)
        own = fp.explained_tokens(found, [p.own for p in seen], *extra)
        every = fp.explained_tokens(found, [p.own or bool(p.other) for p in seen], *extra)
        if cached <= own:
            return Finding(None, OWN, cached, own, every, mode=mode)
        if cached > every:
            return Finding(Verdict.UNEXPLAINED, NOBODY, cached, own, every, mode=mode)
        if not found.exact and await self._other_forms(obs):
            return Finding(Verdict.UNEXPLAINED, OTHER_FORM, cached, own, every, mode=mode)
        other = _first_other(seen)
        return Finding(Verdict.VIOLATION, ATTRIBUTED, cached, own, every, other, mode)

    async def _other_forms(self, obs: Observation) -> bool:
        """Whether the namespace also sent this model prompts in a form bound mode cannot
        relate to this one (then its own hit may be on those: never attributed)."""
        try:
            seen = await self.history.presence(
                obs.who, obs.other_forms, obs.nonce, [False] * len(obs.other_forms)
            )
        except SharedUnavailable:
            return True  # cannot rule it out: never attributed
        return any(p.own for p in seen)


def _first_other(seen: list[Presence]) -> str:
    """The namespace of the first key only another namespace recorded."""
    tag = next((p.other for p in seen if p.other and not p.own), 0)
    return fp.label_of(tag) if tag else ""
