"""Canonical JSON: the RFC 8785 vectors, and the fast path (orjson, sorted keys) agreeing with the
reference implementation over the whole domain receipts use."""

from __future__ import annotations

import struct

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from kvfence.receipts.jcs import MAX_SAFE_INT, CanonicalError, canonical

# RFC 8785 section 3.2.2 (the sample input) and 3.2.3 (sorting by UTF-16 code units).
SAMPLE = {
    "numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
    "string": "\u20ac$\u000f\u000aA'\u0042\u0022\u005c\\\"/",
    "literals": [None, True, False],
}
SAMPLE_OUT = (
    '{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
    '"string":"\u20ac$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}'
)
SORTING = {
    "\u20ac": "Euro Sign",
    "\r": "Carriage Return",
    "\ufb33": "Hebrew Letter Dalet With Dagesh",
    "1": "One",
    "\U0001f600": "Emoji: Grinning Face",
    "\u0080": "Control",
    "\u00f6": "Latin Small Letter O With Diaeresis",
}
SORTED_KEYS = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\U0001f600", "\ufb33"]
# RFC 8785 appendix B: IEEE 754 bit patterns and their canonical text.
NUMBERS = {
    0x0000000000000000: "0",
    0x8000000000000000: "0",
    0x0000000000000001: "5e-324",
    0x8000000000000001: "-5e-324",
    0x7FEFFFFFFFFFFFFF: "1.7976931348623157e+308",
    0x4340000000000000: "9007199254740992",
    0xC340000000000000: "-9007199254740992",
    0x4430000000000000: "295147905179352830000",
    0x44B52D02C7E14AF5: "9.999999999999997e+22",
    0x44B52D02C7E14AF6: "1e+23",
    0x3EB0C6F7A0B5ED8D: "0.000001",
    0x3EB0C6F7A0B5ED8C: "9.999999999999997e-7",
}


def test_rfc_sample() -> None:
    assert canonical(SAMPLE) == SAMPLE_OUT.encode()


def test_rfc_sorting_by_utf16_code_units() -> None:
    out = canonical(SORTING).decode()
    positions = [out.index(rfc8785.dumps(k).decode() + ":") for k in SORTED_KEYS]
    assert positions == sorted(positions)


@pytest.mark.parametrize("bits", list(NUMBERS))
def test_rfc_numbers(bits: int) -> None:
    (value,) = struct.unpack(">d", bits.to_bytes(8, "big"))
    assert canonical(value) == NUMBERS[bits].encode()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**53, "\ud800", {1: "x"}])
def test_values_without_a_canonical_form_are_refused(value: object) -> None:
    with pytest.raises(CanonicalError):
        canonical(value)


_KEYS = st.text(max_size=8)  # any code point, the non-BMP ones included
_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INT, MAX_SAFE_INT)
    | st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=12)
)
_VALUES = st.recursive(
    _LEAVES,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(_VALUES)
def test_fast_path_equals_the_reference(value: object) -> None:
    assert canonical(value) == rfc8785.dumps(value)
