"""Prompt-prefix fingerprints for the detective audit, and how many cached tokens the
namespace's own history can explain.

Bound mode (no tokenizer): the prompt as a canonical byte stream (per message a separator, the
role and the text), with keyed digests of its prefixes at checkpoints 32·2^j bytes and at its
end. If checkpoint p is in the history and the next one is not, no recorded prompt shares as
much as that next checkpoint with this one; a byte-level tokenizer never makes more tokens than
bytes, and the chat template adds at most the policy's overhead per message, which bounds what
a server could honestly have cached.

Exact mode (the policy names the tokenizer): the rendered prompt's token ids in the server's
blocks, chained; the explained tokens are the leading blocks the history holds.

Invariant: the namespace is part of every key, and keys are keyed digests: the history can
answer "has this namespace sent this prefix" and nothing else.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

from gateway.inputs import jsonbody
from gateway.inputs.paths import CHAT, RESPONSES

CHUNK: Final = 32
_MSG: Final = b"\x1e"
_ROLE: Final = b"\x1f"


@dataclass(frozen=True, slots=True)
class Fingerprints:
    """One prompt's checkpoint keys. `positions[i]` is where checkpoint i ends: bytes of the
    stream (bound mode) or tokens (exact mode); `starts` are message starts (bound mode)."""

    keys: tuple[int, ...]
    positions: tuple[int, ...]
    total: int
    exact: bool
    starts: tuple[int, ...] = ()


def _text(content: Any) -> bytes:
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass")
    # Content parts: text as text; anything else (images, audio) by its exact JSON.
    return b"".join(
        part["text"].encode("utf-8", "surrogatepass")
        if isinstance(part, dict) and isinstance(part.get("text"), str)
        else jsonbody.dumps(part, orjson.OPT_SORT_KEYS)
        for part in (content if isinstance(content, list) else [content])
    )


def prompt_stream(path: str, body: dict[str, Any]) -> tuple[bytes, tuple[int, ...]]:
    """The canonical stream of what a server turns into the prompt, and its message starts."""
    pieces: list[tuple[str, Any]] = []
    for key in ("tools", "functions", "response_format"):
        if body.get(key) is not None:  # rendered into the prompt by many chat templates
            pieces.append((key, jsonbody.dumps(body[key], orjson.OPT_SORT_KEYS).decode()))
    if path == CHAT:
        messages = body.get("messages")
        for m in messages if isinstance(messages, list) else []:
            if isinstance(m, dict):
                pieces.append((str(m.get("role")), m.get("content")))
    elif path == RESPONSES:
        if body.get("instructions") is not None:
            pieces.append(("system", body["instructions"]))
        items = body.get("input")
        for item in items if isinstance(items, list) else [{"role": "user", "content": items}]:
            if isinstance(item, dict):
                pieces.append((str(item.get("role", item.get("type"))), item.get("content")))
    else:
        prompt = body.get("prompt")
        pieces += [("prompt", p) for p in (prompt if isinstance(prompt, list) else [prompt])]
    stream, starts = b"", []
    for role, content in pieces:
        starts.append(len(stream))
        stream += _MSG + role.encode() + _ROLE + _text(content)
    return stream, tuple(starts)


def assistant_turn(text: str) -> bytes:
    """What a completion adds to the stream when the client sends it back as the next turn."""
    return _MSG + b"assistant" + _ROLE + text.encode("utf-8", "surrogatepass")


def _key(digest: bytes) -> int:
    return int.from_bytes(digest[:8], "little") or 1  # 0 marks an empty slot in the store


def checkpoints(stream: bytes, start: int = 0) -> list[int]:
    """Checkpoint positions above `start`: 32, 64, 128, ... and the end."""
    out, p = [], CHUNK
    while p < len(stream):
        if p > start:
            out.append(p)
        p *= 2
    if len(stream) > start:
        out.append(len(stream))
    return out


@functools.lru_cache(maxsize=16)  # a worker has one history secret; keying costs per request
def _keyed(secret: bytes, person: bytes) -> hashlib.blake2b:
    """The keyed hasher before any data: callers take a copy and never update this one."""
    return hashlib.blake2b(key=secret[:64], digest_size=16, person=person)


def bound_keys(secret: bytes, namespace: str, stream: bytes, positions: Sequence[int]) -> list[int]:
    """Keyed digests of the stream's prefixes at `positions` (ascending)."""
    h = _keyed(secret, b"kvfence-hist-b").copy()
    h.update(namespace.encode() + b"\x00")
    keys, at = [], 0
    for p in positions:
        h.update(stream[at:p])
        at = p
        keys.append(_key(h.copy().digest()))
    return keys


def block_keys(secret: bytes, namespace: str, ids: Sequence[int], block: int) -> list[int]:
    """Keyed, chained digests of every full block of token ids."""
    h = _keyed(secret, b"kvfence-hist-x").copy()
    h.update(namespace.encode() + b"\x00")
    keys = []
    for end in range(block, len(ids) + 1, block):
        h.update(b"".join(t.to_bytes(4, "little") for t in ids[end - block : end]))
        keys.append(_key(h.copy().digest()))
    return keys


def explained_tokens(
    fp: Fingerprints, counts: Sequence[int], overhead: int, per_message: int
) -> int:
    """The most cached tokens this prompt's history explains. `counts[i]` is how often key i
    was recorded, this request's own recording included (so other requests make it >= 2)."""
    if fp.exact:
        lead = 0
        while lead < len(counts) and counts[lead] >= 2:
            lead += 1
        return fp.positions[lead - 1] if lead else 0
    matched = [i for i, n in enumerate(counts) if n >= 2]
    last = matched[-1] if matched else -1
    # No recorded prompt shares the next unmatched checkpoint's prefix: the common prefix is
    # shorter than that (or, with everything matched, at most the whole stream).
    shared = fp.positions[last + 1] if last + 1 < len(fp.positions) else fp.total
    messages = sum(1 for s in fp.starts if s < shared)
    return overhead + per_message * max(messages, 1) + shared
