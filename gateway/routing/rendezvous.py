"""Which of a model's backends serves a namespace: weighted rendezvous (highest random weight)
hashing, so a namespace keeps landing where its cached blocks are. Pure functions.

Invariant: a backend's score for a namespace depends only on the two names and its weight, so
adding or losing a backend moves only the namespaces that backend wins or held; every gateway
replica ranks alike without sharing any state.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Final, Protocol, TypeVar

_UNIT: Final = float(1 << 53)


class Weighted(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def weight(self) -> float: ...


W = TypeVar("W", bound=Weighted)


def score(namespace: str, backend: str, weight: float) -> float:
    """The backend's claim on the namespace: -weight / ln(u), u uniform in (0, 1) from a hash;
    with weights w_i, backend i wins a namespace with probability w_i / sum(w)."""
    digest = hashlib.blake2b(
        namespace.encode() + b"\0" + backend.encode(), digest_size=8, person=b"kvf-route"
    ).digest()
    unit = ((int.from_bytes(digest, "big") >> 11) + 0.5) / _UNIT  # strictly inside (0, 1)
    return -weight / math.log(unit)


def rank(namespace: str, backends: Sequence[W]) -> list[W]:
    """`backends` best first for `namespace` (ties, which need equal hashes, by name)."""
    return sorted(backends, key=lambda b: (-score(namespace, b.name, b.weight), b.name))
