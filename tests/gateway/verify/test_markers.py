"""Canary markers: only the key's holder can mint one that counts, they stay live for a bounded
time, and a marker split over many pieces of a stream is still found."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.verify.markers import LIVE_S, MARKER_LEN, MarkerKey, MarkerScanner

KEY = MarkerKey(b"k" * 32)
NOW = 1_800_000_000.0


def test_a_minted_marker_is_found_and_a_forged_one_is_not() -> None:
    marker = KEY.mint(NOW)
    assert len(marker) == MARKER_LEN and marker.startswith("kvfc")
    assert KEY.find(f"the answer mentions {marker} here", NOW) == [marker]
    other = MarkerKey(b"o" * 32).mint(NOW)
    assert KEY.find(f"and {other} too", NOW) == []  # another key's marker
    forged = marker[:-1] + ("0" if marker[-1] != "0" else "1")
    assert KEY.find(forged, NOW) == []


def test_markers_expire() -> None:
    marker = KEY.mint(NOW)
    assert KEY.find(marker, NOW + LIVE_S - 1) == [marker]
    assert KEY.find(marker, NOW + LIVE_S + 1) == []


@given(
    st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=40), st.text(max_size=30)
)
def test_a_marker_split_anyhow_is_found(cuts: list[int], noise: str) -> None:
    marker = KEY.mint()
    text = noise + marker + noise
    scanner, at = MarkerScanner(KEY), 0
    for size in cuts * 20:
        scanner.feed(text[at : at + size])
        at += size
        if at >= len(text):
            break
    scanner.feed(text[at:])
    assert scanner.found == [marker]


def test_the_start_of_a_marker_is_held_back() -> None:
    scanner = MarkerScanner(KEY)
    scanner.feed("plain text kv")
    assert not scanner.started  # "kv" alone says nothing
    scanner.feed("fc0a1")
    assert scanner.started
    scanner.feed("zz")  # not hex: it cannot be a marker any more
    assert not scanner.started and not scanner.found
