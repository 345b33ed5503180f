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

    __slots__ = ("_value", "ceiling", "ephemeral", "floor", "group", "label")

    _value: str
    label: str  # `namespace_label(value)`: the only form logs, metrics and records carry
    group: str  # the capacity group (one per tenant; opaque): its namespaces share one ceiling
    ceiling: float  # the largest share of the KV pool the group may hold
    floor: float  # the share below which other groups may not evict the group's blocks
    ephemeral: bool  # scope `request`: never cached; its blocks are zeroed as soon as freed

    def __init__(
        self,
        value: str,
        *,
        group: str = "",
        ceiling: float = 1.0,
        floor: float = 0.0,
        ephemeral: bool = False,
        _token: object = None,
    ) -> None:
        if _token is not _MINT:
            raise TypeError("a Namespace comes only from a verified handle")
        if not 0.0 <= floor <= ceiling <= 1.0 or ceiling <= 0.0:
            raise ValueError("need 0 <= floor <= ceiling <= 1 and ceiling > 0")
        object.__setattr__(self, "_value", value)
        object.__setattr__(self, "label", namespace_label(value))
        object.__setattr__(self, "group", group or self.label)
        object.__setattr__(self, "ceiling", ceiling)
        object.__setattr__(self, "floor", floor)
        object.__setattr__(self, "ephemeral", ephemeral)

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


def _mint(
    value: str,
    group: str = "",
    ceiling: float = 1.0,
    floor: float = 0.0,
    *,
    ephemeral: bool = False,
) -> Namespace:
    """Only `kvfence.handle` (after verification) and tests call this. Without a group the
    namespace is a group of its own."""
    if not value:
        raise ValueError("empty namespace")
    return Namespace(
        value, group=group, ceiling=ceiling, floor=floor, ephemeral=ephemeral, _token=_MINT
    )
