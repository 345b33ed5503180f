"""Public prefixes in the shared contract: the leading part of a prompt that a handle lets our
backend place in, and read from, a public namespace, and the digest both sides compute of it.

Invariant: a `PublicPart` names its content only by position (leading messages, characters of
the last one) and digest; the backend recomputes the digest from the body it received and
refuses the request when they differ, so nothing but the content the gateway matched against the
policy (or the tenant marked) can land in a public namespace.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvfence.capability import Namespace
from kvfence.keys.keyfile import b64url
from kvfence.share import Share

PUBLIC_GROUP: Final = "public"  # the capacity group of the policy's declared public prefixes
MAX_PARTS: Final = 4
_CHAT: Final = b"kvfence/public/chat/v1"
_TEXT: Final = b"kvfence/public/text/v1"
_DIGEST_RE: Final = re.compile(r"^[A-Za-z0-9_-]{43}$")
_KEYS: Final = frozenset({"ns", "m", "c", "d", "grp", "sh"})


def _field(value: str) -> bytes:
    raw = value.encode("utf-8", "surrogatepass")
    return len(raw).to_bytes(4, "big") + raw


def chat_digest(messages: Sequence[tuple[str, str]]) -> str:
    """Of leading chat messages as (role, content), the last content already cut to its public
    characters; roles as our backend reads them (`developer` is `system`)."""
    data = _CHAT + b"".join(_field(role) + _field(content) for role, content in messages)
    return b64url(hashlib.sha256(data).digest())


def text_digest(text: str) -> str:
    """Of the public head of a completion prompt."""
    return b64url(hashlib.sha256(_TEXT + _field(text)).digest())


@dataclass(frozen=True, slots=True)
class PublicPart:
    """One public part of a request, as the gateway signs it into a handle (claim `pub`): the
    first `messages` chat messages (0: the completion prompt), the last of them cut to `chars`
    characters, whose content has `digest`, may be cached in `namespace`, a capacity group of
    its own (`share`)."""

    namespace: str
    messages: int
    chars: int
    digest: str
    share: Share

    def __post_init__(self) -> None:
        if not self.namespace or self.messages < 0 or self.chars < 1:
            raise ValueError("a public part needs a namespace, messages >= 0 and chars >= 1")
        if not _DIGEST_RE.fullmatch(self.digest):
            raise ValueError("a public part's digest is a SHA-256 in base64url")

    @property
    def extent(self) -> tuple[int, int]:
        return self.messages, self.chars

    def claim(self) -> dict[str, Any]:
        share = self.share
        return {"ns": self.namespace, "m": self.messages, "c": self.chars, "d": self.digest,
                "grp": share.group, "sh": [share.ceiling, share.floor]}  # fmt: skip


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _part(item: Any) -> PublicPart:
    if not isinstance(item, dict) or set(item) != _KEYS:
        raise ValueError(f"each public part is an object with exactly {sorted(_KEYS)}")
    ns, m, c, d, grp, sh = (item[k] for k in ("ns", "m", "c", "d", "grp", "sh"))
    if not (isinstance(ns, str) and isinstance(d, str) and isinstance(grp, str)):
        raise ValueError("public part: ns, d and grp are strings")
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (m, c)):
        raise ValueError("public part: m and c are integers")
    if not isinstance(sh, list) or len(sh) != 2 or not all(_number(x) for x in sh):
        raise ValueError("public part: sh is [ceiling, floor]")
    return PublicPart(ns, m, c, d, Share(grp, float(sh[0]), float(sh[1])))


def parse_parts(value: Any, own_namespace: str) -> tuple[PublicPart, ...]:
    """The `pub` claim: at most MAX_PARTS parts, each reaching strictly further than the one
    before, all chat or all completion, none in the request's own namespace (ValueError)."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_PARTS:
        raise ValueError(f"claim 'pub' is a list of 1 to {MAX_PARTS} public parts")
    parts = tuple(_part(item) for item in value)
    names = [p.namespace for p in parts]
    if own_namespace in names or len(set(names)) != len(names):
        raise ValueError("public namespaces must be distinct and not the request's own")
    if len({p.messages == 0 for p in parts}) != 1:
        raise ValueError("public parts are all of chat messages or all of a completion prompt")
    if any(a.extent >= b.extent for a, b in itertools.pairwise(parts)):
        raise ValueError("each public part must reach further than the one before")
    return parts


@dataclass(frozen=True, slots=True)
class PublicGrant:
    """A verified public part: the backend may place the leading blocks of the part's content
    (after checking its digest) in `namespace`, and read them from there."""

    namespace: Namespace
    messages: int
    chars: int
    digest: str
