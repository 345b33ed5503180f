"""Prompt-prefix fingerprints for the detective audit, and how many cached tokens a set of
recorded prefixes can explain.

Bound mode (no tokenizer): the prompt as a canonical byte stream (per message a separator, the
role and the text, as `render` gives it), with keyed digests of its prefixes at checkpoints
32·2^j bytes and at its end. If checkpoint p is in the history and the next one is not, no
recorded prompt shares as much as that next checkpoint with this one; a byte-level tokenizer
never makes more tokens than bytes, and the chat template adds at most the policy's overhead
per message, which bounds what a server could have cached from those prompts.

Exact mode (the policy names the tokenizer): the rendered prompt's token ids in the server's
blocks, chained; the explained tokens are the leading blocks the history holds. Chat,
Responses and completions requests that render to the same ids have the same keys.

Invariant: a key is a keyed digest of the model and a prefix, never of text alone and never
readable back; which namespaces sent a key is the history's business, not the key's.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.inputs.paths import COMPLETIONS
from gateway.verify import render

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


def prompt_stream(path: str, body: dict[str, Any]) -> tuple[bytes, tuple[int, ...]]:
    """The canonical stream of what a server turns into the prompt, and its message starts."""
    pieces: list[tuple[str, str]] = render.prompt_fields(body)
    conversation = render.messages(path, body)
    if conversation is not None:
        pieces += [(m["role"], m["content"]) for m in conversation]
    elif path == COMPLETIONS:
        prompt = render.completion_prompt(body)
        if isinstance(prompt, list):  # token ids: they match only token ids
            pieces.append(("ids", ",".join(map(str, prompt))))
        elif isinstance(prompt, str):
            pieces.append(("prompt", prompt))
        else:
            raw = body.get("prompt")
            for p in raw if isinstance(raw, list) else [raw]:
                pieces.append(("prompt", render.content_text(p)))
    stream, starts = b"", []
    for role, content in pieces:
        starts.append(len(stream))
        stream += _MSG + role.encode() + _ROLE + content.encode("utf-8", "surrogatepass")
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


def bound_hasher(secret: bytes, model: str) -> hashlib.blake2b:
    """The keyed hasher of the model's stream, before any of the stream."""
    h = _keyed(secret, b"kvfence-hist-b").copy()
    h.update(model.encode() + b"\x00")
    return h


def bound_keys(secret: bytes, model: str, stream: bytes, positions: Sequence[int]) -> list[int]:
    """Keyed digests of the model's stream prefixes at `positions` (ascending)."""
    return extend_keys(bound_hasher(secret, model), stream, 0, positions)


def extend_keys(h: hashlib.blake2b, stream: bytes, at: int, positions: Sequence[int]) -> list[int]:
    """`bound_keys` from a hasher that has taken `stream[:at]`; it is left at the last position
    (so a longer stream's keys go on from there without hashing the prefix again)."""
    keys = []
    for p in positions:
        h.update(stream[at:p])
        at = p
        keys.append(_key(h.copy().digest()))
    return keys


def block_keys(secret: bytes, model: str, ids: Sequence[int], block: int) -> list[int]:
    """Keyed, chained digests of every full block of the model's token ids."""
    h = _keyed(secret, b"kvfence-hist-x").copy()
    h.update(model.encode() + b"\x00")
    keys = []
    for end in range(block, len(ids) + 1, block):
        h.update(b"".join(t.to_bytes(4, "little") for t in ids[end - block : end]))
        keys.append(_key(h.copy().digest()))
    return keys


FAMILIES: Final = ("chat", "text", "ids")  # forms bound mode cannot relate to each other


def family(path: str, body: dict[str, Any]) -> str:
    """Which form a prompt came in, as bound mode sees it: a conversation (chat, Responses), a
    completions prompt as text, or as token ids."""
    if path != COMPLETIONS:
        return "chat"
    return "ids" if isinstance(render.completion_prompt(body), list) else "text"


@functools.lru_cache(maxsize=64)  # per model, once
def family_keys(secret: bytes, model: str) -> dict[str, int]:
    """One key per form: "this namespace sent prompts in this form to this model"."""
    out = {}
    for name in FAMILIES:
        h = _keyed(secret, b"kvfence-hist-f").copy()
        h.update(model.encode() + b"\x00" + name.encode())
        out[name] = _key(h.digest())
    return out


def namespace_tag(namespace: str) -> int:
    """The namespace as the history names it: the first 64 bits of its label
    (`kvfence.namespace.namespace_label`), so evidence can name it as audit records do."""
    return int.from_bytes(hashlib.sha256(namespace.encode()).digest()[:8], "big") or 1


def label_of(tag: int) -> str:
    """The 16 hex characters a namespace label starts with, for a tag."""
    return f"{tag:016x}"


def explained_tokens(
    fp: Fingerprints, present: Sequence[bool], overhead: int, per_message: int
) -> int:
    """The most cached tokens that the recorded prefixes marked `present` explain."""
    if fp.exact:
        lead = 0
        while lead < len(present) and present[lead]:
            lead += 1
        return fp.positions[lead - 1] if lead else 0
    matched = [i for i, hit in enumerate(present) if hit]
    last = matched[-1] if matched else -1
    # No recorded prompt shares the next unmatched checkpoint's prefix: the common prefix is
    # shorter than that (or, with everything matched, at most the whole stream).
    shared = fp.positions[last + 1] if last + 1 < len(fp.positions) else fp.total
    messages = sum(1 for s in fp.starts if s < shared)
    return overhead + per_message * max(messages, 1) + shared
