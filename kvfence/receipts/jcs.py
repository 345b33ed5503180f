"""RFC 8785 canonical JSON (JCS), the bytes every receipt signature and digest covers.

`rfc8785` (a pure-Python implementation of the RFC) is the reference. Receipts hold only
objects, arrays, strings, integers, booleans and null (the ACI receipt format forbids other
numbers), and for that domain orjson with sorted keys writes the same bytes a hundred times
faster: its string escaping equals JCS for every code point, and its key order equals JCS's
UTF-16 order for keys without characters beyond U+FFFF. `canonical` takes that path only for
values inside the domain and hands anything else to `rfc8785`; the tests prove the two agree.

Invariant: `canonical` returns the JCS bytes of its argument or raises `CanonicalError`.
"""

from __future__ import annotations

from typing import Any, Final

import orjson
import rfc8785

MAX_SAFE_INT: Final = 2**53 - 1  # JCS numbers are IEEE doubles: beyond this an integer is inexact


class CanonicalError(ValueError):
    """The value has no canonical JSON form (a float out of range, a huge integer, a lone
    surrogate, a key that is not a string...)."""


def _fast(value: Any) -> bool:
    """Whether `value` lies in the domain where orjson's sorted output is JCS."""
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return True
    if isinstance(value, int):
        return -MAX_SAFE_INT <= value <= MAX_SAFE_INT
    if isinstance(value, dict):
        return all(type(k) is str and k.isascii() and _fast(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_fast(v) for v in value)
    return False


def canonical(value: Any) -> bytes:
    """The JCS serialisation of `value` (UTF-8 bytes)."""
    if _fast(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError as exc:  # a lone surrogate in a string
            raise CanonicalError(f"no canonical JSON: {exc}") from None
    try:
        return rfc8785.dumps(value)
    except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError) as exc:
        raise CanonicalError(f"no canonical JSON: {exc}") from None
