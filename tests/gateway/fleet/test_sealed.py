"""Sealed shared values: a value opens only under its own key name and field, unchanged, with a
time that is not in the future (nor too old, when the reader bounds its age); anything else is
unknown (None)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.fleet.sealed import Sealer

SECRET = b"s" * 32
NOW = 1_800_000_000.0


def test_a_sealed_value_opens_with_its_time() -> None:
    sealer = Sealer(SECRET)
    raw = sealer.seal("kvf1:health", "backend-a", b'{"q":1}', now=NOW)
    opened = sealer.open("kvf1:health", "backend-a", raw, now=NOW + 1)
    assert opened is not None and opened.value == b'{"q":1}' and opened.written == NOW


def test_another_name_field_or_key_does_not_open_it() -> None:
    sealer = Sealer(SECRET)
    raw = sealer.seal("kvf1:health", "backend-a", b"v", now=NOW)
    assert sealer.open("kvf1:health", "backend-b", raw, now=NOW) is None  # moved to a field
    assert sealer.open("kvf1:limits", "backend-a", raw, now=NOW) is None  # moved to a key
    assert Sealer(b"t" * 32).open("kvf1:health", "backend-a", raw, now=NOW) is None


def test_future_dated_and_stale_values_are_unknown() -> None:
    sealer = Sealer(SECRET, skew_s=30)
    ahead = sealer.seal("n", "f", b"v", now=NOW + 3600)
    assert sealer.open("n", "f", ahead, now=NOW) is None
    old = sealer.seal("n", "f", b"v", now=NOW - 120)
    assert sealer.open("n", "f", old, now=NOW) is not None
    assert sealer.open("n", "f", old, max_age_s=60, now=NOW) is None


def test_missing_or_plain_values_are_unknown() -> None:
    sealer = Sealer(SECRET)
    for raw in (None, b"", b"S1", b'{"quarantined": false}'):
        assert sealer.open("n", "f", raw, now=NOW) is None


@given(st.binary(max_size=64), st.integers(min_value=0), st.integers(min_value=0, max_value=255))
def test_any_changed_byte_is_unknown(value: bytes, where: int, flip: int) -> None:
    sealer = Sealer(SECRET)
    raw = bytearray(sealer.seal("n", "f", value, now=NOW))
    i = where % len(raw)
    raw[i] ^= flip or 1
    assert sealer.open("n", "f", bytes(raw), now=NOW) is None
