"""The log's text formats: a checkpoint's body (c2sp.org/tlog-checkpoint), an inclusion proof
with its checkpoint (c2sp.org/tlog-proof) and a consistency proof with its checkpoint (the body
of a c2sp.org/tlog-witness add-checkpoint request: `old N`, the proof, a blank line, the note).

Invariant: every parser accepts only its format's exact shape and raises `FormatError` with one
line naming what is wrong; formatting then parsing gives back the same value.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Final

from kvfence.receipts.merkle import HASH_SIZE

PROOF_HEADER: Final = "c2sp.org/tlog-proof@v1"
_DECIMAL: Final = re.compile(r"0|[1-9][0-9]{0,19}")


class FormatError(ValueError):
    """Text that is not the format it claims to be."""


def _number(text: str, what: str) -> int:
    if not _DECIMAL.fullmatch(text):
        raise FormatError(f"{what} {text[:24]!r} is not a decimal number")
    return int(text)


def _hash(text: str, what: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise FormatError(f"{what} is not base64") from None
    if len(raw) != HASH_SIZE:
        raise FormatError(f"{what} is not a SHA-256 hash")
    return raw


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint's first three lines (this log writes no extension lines)."""

    origin: str
    size: int
    root: bytes

    @property
    def body(self) -> str:
        return f"{self.origin}\n{self.size}\n{b64(self.root)}\n"

    @classmethod
    def parse(cls, text: str) -> Checkpoint:
        """From a note's text (extension lines after the third are allowed and ignored)."""
        lines = text.split("\n")
        if len(lines) < 4 or lines[-1] != "" or not lines[0]:
            raise FormatError("a checkpoint is an origin line, a size and a root hash")
        return cls(lines[0], _number(lines[1], "tree size"), _hash(lines[2], "root hash"))


@dataclass(frozen=True, slots=True)
class InclusionProof:
    """A c2sp.org/tlog-proof: an entry's index, its inclusion path and the signed checkpoint
    (a whole note), with optional unauthenticated `extra` data."""

    index: int
    path: tuple[bytes, ...]
    note: str
    extra: bytes | None = None

    def format(self) -> str:
        lines = [PROOF_HEADER]
        if self.extra is not None:
            lines.append(f"extra {b64(self.extra)}")
        lines.append(f"index {self.index}")
        lines += [b64(h) for h in self.path]
        return "\n".join(lines) + "\n\n" + self.note

    @classmethod
    def parse(cls, text: str) -> InclusionProof:
        head, sep, note = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or lines[0] != PROOF_HEADER:
            raise FormatError(f"not a tlog proof: it must start with {PROOF_HEADER}")
        extra = None
        rest = lines[1:]
        if rest and rest[0].startswith("extra "):
            try:
                extra = base64.b64decode(rest[0][6:], validate=True)
            except binascii.Error:
                raise FormatError("the proof's extra data is not base64") from None
            rest = rest[1:]
        if not rest or not rest[0].startswith("index "):
            raise FormatError("the proof has no index line")
        index = _number(rest[0][6:], "index")
        path = tuple(_hash(h, f"proof hash {i}") for i, h in enumerate(rest[1:], 1))
        return cls(index, path, note, extra)


@dataclass(frozen=True, slots=True)
class ConsistencyProof:
    """A signed checkpoint and the proof that it extends the tree of `old` leaves."""

    old: int
    path: tuple[bytes, ...]
    note: str

    def format(self) -> str:
        lines = [f"old {self.old}", *(b64(h) for h in self.path)]
        return "\n".join(lines) + "\n\n" + self.note

    @classmethod
    def parse(cls, text: str) -> ConsistencyProof:
        head, sep, note = text.partition("\n\n")
        lines = head.split("\n")
        if not sep or not lines[0].startswith("old "):
            raise FormatError("not a consistency proof: it must start with 'old N'")
        old = _number(lines[0][4:], "old size")
        return cls(
            old, tuple(_hash(h, f"proof hash {i}") for i, h in enumerate(lines[1:], 1)), note
        )
