"""Client-supplied cache-scoping inputs: finding and removing them from headers and bodies.

Invariant: names compare case-insensitively with `_` and `-` alike, so no spelling of a scoping
field or header survives; only an adapter writes scoping fields afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

SCOPING_HEADERS: Final = frozenset(
    {"x-tenant-id", "x-cache-salt", "cache-salt", "x-kvfence-handle", "x-kvfence-namespace"}
)
# `prompt_cache_key` is OpenAI's routing hint; only a session-scoped tenant's copy is taken, as
# its session id (filters.scrub), before this list removes every other spelling.
SCOPING_FIELDS: Final = frozenset({"cache_salt", "extra_key", "prompt_cache_key"})
NESTED_FIELDS: Final = frozenset({"nvext"})


def _header_form(name: str) -> str:
    return name.lower().replace("_", "-")


def _field_form(name: str) -> str:
    return name.lower().replace("-", "_")


def is_scoping_header(name: str) -> bool:
    return _header_form(name) in SCOPING_HEADERS


def scoping_headers(names: Iterable[str]) -> list[str]:
    """The canonical names of scoping headers among `names` (one entry per copy)."""
    return [_header_form(n) for n in names if _header_form(n) in SCOPING_HEADERS]


def strip_body(body: dict[str, Any]) -> list[str]:
    """Remove every scoping field (top level and inside `nvext`); return what was removed."""
    found: list[str] = []
    for key in [k for k in body if _field_form(k) in SCOPING_FIELDS]:
        del body[key]
        found.append(_field_form(key))
    for key in [k for k in body if _field_form(k) in NESTED_FIELDS]:
        nested = body[key]
        if not isinstance(nested, dict):
            continue
        for inner in [k for k in nested if _field_form(k) in SCOPING_FIELDS]:
            del nested[inner]
            found.append(f"{_field_form(key)}.{_field_form(inner)}")
    return found
