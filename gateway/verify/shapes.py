"""The shape of a request, as canary rounds copy it: the path, streamed or not, how many
messages the prompt is split into, about how long it is, and the sampling fields (names and
values) it sends. Never any of its text. A round sends fresh canary text in a shape: one taken
from a tenant's request (a round that request triggered), or drawn from what the traffic sent
recently and the dimensions layers have broken on (a scheduled round).

Invariant: a shape holds numbers, booleans and field names only; its `label` is what /status,
metrics and receipts show, and two shapes with the same label send alike.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.inputs.paths import CHAT, COMPLETIONS, RESPONSES

_SHORT: Final = {CHAT: "chat", COMPLETIONS: "completions", RESPONSES: "responses"}
# Sampling fields a round copies (numbers and booleans only): layers have keyed on them.
SAMPLING: Final = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "n",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)
_LIMITS: Final = {"n": 2, "top_logprobs": 5}  # a round never asks for more than this
MAX_FIELD: Final = {CHAT: "max_tokens", COMPLETIONS: "max_tokens", RESPONSES: "max_output_tokens"}
MIN_TOKENS: Final = 64  # a canary prompt spans at least this many tokens (cache blocks)
MAX_TOKENS: Final = 16384


@dataclass(frozen=True, slots=True)
class Shape:
    path: str
    stream: bool
    messages: int  # the prompt split over this many messages (1: one user message)
    tokens: int  # about this many prompt tokens (one per letter of canary text)
    sampling: tuple[tuple[str, float | int | bool], ...] = ()

    @property
    def label(self) -> str:
        names = ",".join(name for name, _ in self.sampling)
        kind = "stream" if self.stream else "plain"
        return f"{_SHORT[self.path]}/{kind}/{self.messages}m/{self.tokens}t" + (
            f"/{names}" if names else ""
        )

    def body(self, model: str, text: str) -> dict[str, Any]:
        """A request of this shape carrying `text` (the canary's), before the adapter scopes
        it: one output token, greedy, with usage asked for when streaming."""
        body: dict[str, Any] = {"model": model, "temperature": 0, MAX_FIELD[self.path]: 1}
        body.update(self.sampling)
        if self.path == COMPLETIONS:
            body["prompt"] = text
        else:
            parts = _split(text, self.messages)
            lead = "system" if self.path == CHAT and len(parts) > 1 else "user"
            turns = [
                {"role": lead if i == 0 else _role(i), "content": p} for i, p in enumerate(parts)
            ]
            turns[-1]["role"] = "user"
            body["messages" if self.path == CHAT else "input"] = turns
        if self.stream:
            body["stream"] = True
            if self.path != RESPONSES:
                body["stream_options"] = {"include_usage": True}
        return body


def _role(i: int) -> str:
    return "user" if i % 2 else "assistant"


def _split(text: str, count: int) -> list[str]:
    words = text.split(" ")
    count = max(1, min(count, len(words)))
    step = -(-len(words) // count)
    return [" ".join(words[i : i + step]) for i in range(0, len(words), step)]


def _number(value: Any) -> bool:
    return isinstance(value, int | float)  # booleans included (logprobs)


def of_request(path: str, body: dict[str, Any], prompt_tokens: int | None) -> Shape:
    """The shape of a tenant's request (for a round it triggers)."""
    turns = body.get("messages") if path == CHAT else body.get("input")
    messages = len(turns) if isinstance(turns, list) and path != COMPLETIONS else 1
    sampling = []
    for name in SAMPLING:
        value = body.get(name)
        if value is not None and _number(value):
            limit = _LIMITS.get(name)
            sampling.append((name, min(value, limit) if limit is not None else value))
    tokens = prompt_tokens if prompt_tokens else len(str(turns or body.get("prompt", ""))) // 4
    tokens = -(-int(tokens) // MIN_TOKENS) * MIN_TOKENS  # whole steps: fewer distinct shapes
    return Shape(
        path if path in _SHORT else CHAT,
        bool(body.get("stream")),
        max(1, min(messages, 16)),
        max(MIN_TOKENS, min(tokens, MAX_TOKENS)),
        tuple(sampling),
    )


LENGTHS: Final = (1.0, 4.0, 0.5, 2.0, 3.0)  # times the policy's prompt_tokens, in turn
MESSAGES: Final = (1, 3, 2)


class Shapes:
    """The shapes scheduled rounds send, in turn: a sweep that varies every dimension layers
    have broken on (each length within 5 rounds, each path, streamed or not and each message
    count within a few; every combination within 30; each set of sampling fields tenants sent
    lately in turn), and, every other round once tenants sent some, a copy of one of the last
    distinct shapes tenant requests had."""

    def __init__(self, keep: int = 64, rng: random.Random | None = None) -> None:
        self._seen: deque[Shape] = deque(maxlen=keep)
        self._rng = rng if rng is not None else random.SystemRandom()
        self._turn = 0
        self._sweep = self._rng.randrange(1 << 16)  # where the sweep starts: not predictable

    def saw(self, shape: Shape) -> None:
        if shape not in self._seen:  # distinct shapes: a busy one does not crowd out the rest
            self._seen.append(shape)

    def draw(self, paths: Sequence[str], tokens: int) -> Shape:
        rng = self._rng
        self._turn += 1
        seen = [s for s in self._seen if s.path in paths]
        if seen and self._turn % 2:
            return rng.choice(seen)
        i = self._sweep
        self._sweep += 1
        served = sorted(p for p in paths if p in _SHORT) or [CHAT]
        path = served[i % len(served)]
        # Sampling fields only as tenants sent them: a field no tenant sends could take a
        # server down (vLLM's CPU backend dies on a seeded prompt long enough to be chunked).
        kinds = sorted({s.sampling for s in self._seen}) or [()]
        sampling = kinds[i // 7 % len(kinds)]
        return Shape(
            path,
            i % 2 == 0,
            1 if path == COMPLETIONS else MESSAGES[i // len(served) % len(MESSAGES)],
            max(MIN_TOKENS, min(int(tokens * LENGTHS[i % len(LENGTHS)]), MAX_TOKENS)),
            sampling,
        )
