"""The request body's JSON codec: orjson, with integers outside 64 bits kept exact both ways.

Invariant: `loads` accepts exactly what orjson accepts (orjson validates every body first), and
`dumps(loads(raw))` writes every integer with the digits it arrived with, so a 2^64 `seed` or a
`-2^63 - 1` token id is never turned into a float on its way upstream.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import orjson

# An integer orjson may have read as a float has at least 19 digits (2^63 has 19); bodies
# without such a digit run (nearly all) never take the slow path.
_LONG_DIGITS: Final = re.compile(rb"\d{19}")
MAX_EXACT_DEPTH: Final = 128  # nesting allowed in a body that takes the exact-integer path
_I64_MIN: Final = -(1 << 63)
_U64_MAX: Final = (1 << 64) - 1


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # unreachable after orjson's check; fail closed


def loads(raw: bytes) -> Any:
    """Parse `raw`; raises orjson.JSONDecodeError (a ValueError) when it is not JSON."""
    value = orjson.loads(raw)
    if _LONG_DIGITS.search(raw) is None:
        return value
    # orjson reads integers beyond 64 bits as floats; the standard library reads them exactly.
    if _depth(value) > MAX_EXACT_DEPTH:
        raise ValueError(f"nested deeper than {MAX_EXACT_DEPTH} levels")
    return json.loads(raw, parse_int=int, parse_constant=_no_constant)


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, level)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _exact(value: Any) -> Any:
    """`value` with out-of-range integers as orjson fragments of their exact digits."""
    if isinstance(value, dict):
        return {k: _exact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_exact(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and not _I64_MIN <= value <= _U64_MAX:
        return orjson.Fragment(str(value).encode("ascii"))
    return value


def dumps(body: Any, option: int = 0) -> bytes:
    try:
        return orjson.dumps(body, option=option)
    except TypeError:  # "Integer exceeds 64-bit range": only bodies that carried one
        return orjson.dumps(_exact(body), option=option)
