"""The detective audit of one answer: record the request's prompt-prefix fingerprints before it
is forwarded, and afterwards check that the cached tokens the server reported are explained by
what the same namespace sent before.

Invariant: a hit the history does not explain is a violation only when the history reaches
back at least `block_max_age_s` (else it is `unexplained`): the server may hold blocks from
traffic older than the history, and honest traffic must never be called a violation.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.inputs.paths import CHAT
from gateway.policy.backend_model import DetectiveSettings
from gateway.policy.model import HistorySettings
from gateway.verify import fingerprints as fp
from gateway.verify.store import FingerprintStore
from gateway.verify.tokens import ChatTokenizer
from kvfence.verdict import Verdict


@dataclass(slots=True)
class Observation:
    """What the detective keeps of one request between forwarding and judging."""

    settings: DetectiveSettings
    namespace: str
    stream: bytes
    bound: fp.Fingerprints
    exact: fp.Fingerprints | None = None
    exact_ids: list[int] | None = None


class Detective:
    """One per worker, over the history file every worker of the gateway shares."""

    def __init__(self, store: FingerprintStore, secret: bytes, history: HistorySettings) -> None:
        self.store = store
        self._secret = secret
        self._history = history
        self._tokenizers: dict[Path, ChatTokenizer] = {}

    def _tokenizer(self, folder: Path) -> ChatTokenizer:
        found = self._tokenizers.get(folder)
        if found is None:
            found = self._tokenizers[folder] = ChatTokenizer(folder)
        return found

    async def record(
        self, settings: DetectiveSettings, namespace: str, path: str, body: dict[str, Any]
    ) -> Observation:
        """Fingerprint and record the prompt (before the request is forwarded)."""
        stream, starts = fp.prompt_stream(path, body)
        positions = fp.checkpoints(stream)
        keys = fp.bound_keys(self._secret, namespace, stream, positions)
        bound = fp.Fingerprints(tuple(keys), tuple(positions), len(stream), False, starts)
        obs = Observation(settings, namespace, stream, bound)
        if settings.tokenizer is not None:
            ids = await asyncio.to_thread(self._ids, settings.tokenizer, path, body)
            if ids is not None:
                blocks = fp.block_keys(self._secret, namespace, ids, settings.block_size)
                ends = tuple(range(settings.block_size, len(ids) + 1, settings.block_size))
                obs.exact = fp.Fingerprints(tuple(blocks), ends, len(ids), True)
                obs.exact_ids = ids
                keys = keys + blocks
        self.store.add(keys)
        return obs

    def _ids(self, folder: Path, path: str, body: dict[str, Any]) -> list[int] | None:
        tokenizer = self._tokenizer(folder)
        if path == CHAT:
            messages = body.get("messages")
            if not isinstance(messages, list) or body.get("tools") or body.get("functions"):
                return None
            return tokenizer.chat_ids(messages)
        prompt = body.get("prompt")
        return tokenizer.text_ids(prompt) if isinstance(prompt, str) else None

    def record_answer(self, obs: Observation, text: str) -> None:
        """Record the prompt followed by the answer's text: the next turn of the conversation
        starts with both, and the server cached the answer's blocks too. Synchronous (an
        answer's text is short), so the record is in before the client can send its next turn."""
        if not text:
            return
        longer = obs.stream + fp.assistant_turn(text)
        positions = fp.checkpoints(longer, start=obs.bound.total)
        keys = fp.bound_keys(self._secret, obs.namespace, longer, positions)
        folder = obs.settings.tokenizer
        if folder is not None and obs.exact_ids is not None:
            more = self._tokenizer(folder).text_ids(text, False)
            size = obs.settings.block_size
            blocks = fp.block_keys(self._secret, obs.namespace, obs.exact_ids + more, size)
            keys += blocks[len(obs.exact.keys) if obs.exact else 0 :]
        self.store.add(keys)

    def judge(
        self, obs: Observation, prompt_tokens: int | None, cached: int | None
    ) -> Verdict | None:
        """None when the reported hit is explained (or nothing was reported), else
        UNEXPLAINED or VIOLATION."""
        if not cached:
            return None
        explained = self.explained(obs, prompt_tokens)
        if cached <= explained:
            return None
        covered = time.time() - self.store.complete_since
        return (
            Verdict.VIOLATION if covered >= self._history.block_max_age_s else Verdict.UNEXPLAINED
        )

    def explained(self, obs: Observation, prompt_tokens: int | None) -> int:
        s = obs.settings
        if obs.exact is not None and prompt_tokens == obs.exact.total:
            return fp.explained_tokens(obs.exact, self.store.counts(obs.exact.keys), 0, 0)
        counts = self.store.counts(obs.bound.keys)
        return fp.explained_tokens(
            obs.bound, counts, s.template_overhead_tokens, s.message_overhead_tokens
        )
