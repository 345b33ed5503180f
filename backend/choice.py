"""One choice of a generation: its text through the stop strings, its token count, its finish
reason, and its tokens' logprobs in OpenAI's shape.

Invariant: a choice counts every token the engine generated for it until it is done, and holds
one logprobs entry per counted token (the end-of-sequence token included), each sent once.
"""

from __future__ import annotations

import codecs
from typing import Any, Final

from backend.engine.engine import StepOutput
from backend.engine.plan import TokenLogprobs
from backend.model.tokenizer import Tokenizer
from backend.textstream import TextStream

FLOOR: Final = -9999.0  # OpenAI's stand-in for a logprob too small to represent
_ALL: Final = slice(None)


class Choice:
    def __init__(
        self, index: int, tokenizer: Tokenizer, eos: tuple[int, ...], stop: tuple[str, ...]
    ) -> None:
        self.index = index
        self._tokenizer = tokenizer
        self._eos = eos
        self.text = TextStream(tokenizer.incremental(), stop)
        self.generated = 0
        self.finish = "stop"
        self.done = False
        self.parts: list[str] = []  # the final text so far
        self.logprobs: list[dict[str, Any]] = []  # every entry so far, in chat's shape
        self.offsets: list[int] = []  # per entry: where its text starts in the choice's text
        self.sent = 0  # entries already streamed
        self._chars = 0  # characters of the tokens' text so far (the end token's excluded)
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")

    def take(self, out: StepOutput) -> str:
        """Adds one generated token; returns the text that became final (maybe empty). Once
        the choice is done, outputs still in flight are not counted."""
        if self.done:
            return ""
        self.generated += 1
        if out.logprobs is not None:
            self.logprobs.append(self._entry(out.token_id, out.logprobs))
            self.offsets.append(self._chars)
            if out.token_id not in self._eos:
                self._chars += len(self._utf8.decode(self._tokenizer.token_bytes(out.token_id)))
        piece = "" if out.token_id in self._eos else self.text.push(out.token_id)
        if self.text.stopped:
            self.finish, self.done = "stop", True
        elif out.finished:
            self.finish = "length" if out.finish_reason == "length" else "stop"
            self.done = True
            piece += self.text.finish()
        self.parts.append(piece)
        return piece

    def unsent(self) -> slice:
        """Which logprobs entries are not streamed yet (they are marked sent)."""
        fresh, self.sent = slice(self.sent, len(self.logprobs)), len(self.logprobs)
        return fresh

    def shaped(self, endpoint: str, part: slice = _ALL) -> dict[str, Any]:
        """The logprobs of `part` of the tokens in the endpoint's shape: chat's list of
        entries, or the completions endpoint's parallel lists, whose alternatives always hold
        the chosen token (so up to logprobs + 1 of them, as OpenAI says)."""
        entries = self.logprobs[part]
        if endpoint == "chat":
            return {"content": entries, "refusal": None}
        return {
            "tokens": [e["token"] for e in entries],
            "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [
                {t["token"]: t["logprob"] for t in e["top_logprobs"]} | {e["token"]: e["logprob"]}
                for e in entries
            ],
            "text_offset": self.offsets[part],
        }

    def _entry(self, token_id: int, lp: TokenLogprobs) -> dict[str, Any]:
        entry = self._token(token_id, lp.logprob)
        entry["top_logprobs"] = [self._token(t, v) for t, v in lp.top]
        return entry

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self._tokenizer.token_bytes(token_id)
        return {
            "token": raw.decode("utf-8", "backslashreplace"),  # part of a character: "\\xe2"
            "logprob": max(logprob, FLOOR),
            "bytes": list(raw),
        }
