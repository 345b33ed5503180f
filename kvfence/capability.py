"""The `Namespace` capability: the only value the backend's KV pool accepts as a namespace.

Invariant: production code obtains a `Namespace` only from `kvfence.handle`'s verifier, which
calls `_mint` after checking a handle's signature, expiry, audience, model and replay. There is no
public constructor from a string, header or body field.
"""

from __future__ import annotations

from typing import Final, final

from kvfence.namespace import namespace_label

_MINT: Final = object()


@final
class Namespace:
    """A verified cache namespace. Compare and hash by value; never construct directly."""

    __slots__ = ("_value", "label")

    _value: str
    label: str  # `namespace_label(value)`: the only form logs, metrics and records carry

    def __init__(self, value: str, *, _token: object = None) -> None:
        if _token is not _MINT:
            raise TypeError("a Namespace comes only from a verified handle")
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "label", namespace_label(value))

    @property
    def value(self) -> str:
        return self._value

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Namespace is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Namespace) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("kvfence.Namespace", self._value))

    def __repr__(self) -> str:
        return f"Namespace(#{self.label})"


def _mint(value: str) -> Namespace:
    """Only `kvfence.handle` (after verification) and tests call this."""
    if not value:
        raise ValueError("empty namespace")
    return Namespace(value, _token=_MINT)
