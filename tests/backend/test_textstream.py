"""Stop strings over streamed text: nothing at or after a stop string ever reaches the client,
not even its first characters while it is still forming, and everything before it does."""

from __future__ import annotations

import codecs
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backend.textstream import TextStream


class PieceDecoder:
    """A decoder whose token i is the text piece i (each piece whole, as a real decoder emits)."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def push(self, token_id: int) -> str:
        return self.pieces[token_id]

    def flush(self) -> str:
        return ""


class ByteDecoder:
    """A byte-level decoder: token i is byte i; an incomplete UTF-8 character is held back and,
    if still incomplete at the end, flushed as U+FFFD (like the real incremental decoder)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return str(self._utf8.decode(bytes([token_id])))

    def flush(self) -> str:
        return str(self._utf8.decode(b"", final=True))


def run_pieces(pieces: list[str], stop: tuple[str, ...]) -> tuple[list[str], str, TextStream]:
    """Push every piece; return what each push released, what finish() released, the stream."""
    stream = TextStream(PieceDecoder(pieces), stop)
    released = [stream.push(i) for i in range(len(pieces))]
    return released, stream.finish(), stream


def run_bytes(text: str, stop: tuple[str, ...]) -> tuple[list[str], str, TextStream]:
    stream = TextStream(ByteDecoder(), stop)
    released = [stream.push(b) for b in text.encode()]
    return released, stream.finish(), stream


def test_without_stop_strings_every_piece_is_released_at_once() -> None:
    pieces = ["Hel", "lo", ", ", "world"]
    released, tail, stream = run_pieces(pieces, ())
    assert released == pieces
    assert tail == "" and not stream.stopped


def test_text_is_streamed_as_soon_as_it_cannot_start_a_stop_string() -> None:
    pieces = ["Once upon", " a time", " there", " was"]
    stream = TextStream(PieceDecoder(pieces), ("END",))
    out, seen = "", ""
    for i, piece in enumerate(pieces):
        out += stream.push(i)
        seen += piece
        # Released text is final (a prefix of the whole answer), and at most the last
        # len("END") - 1 characters are still held back: the stream is not buffered to the end.
        assert seen.startswith(out)
        assert len(out) >= len(seen) - 2
    assert out + stream.finish() == "".join(pieces)
    assert not stream.stopped


def test_a_stop_string_split_over_many_tokens_never_leaks() -> None:
    pieces = ["The answer", " is 4", "2.", "<", "|", "st", "op", "|", ">", " and more"]
    stream = TextStream(PieceDecoder(pieces), ("<|stop|>",))
    released = []
    for i in range(len(pieces)):
        released.append(stream.push(i))
        # Not a single character of the stop string is out, at any point in the stream.
        assert "<" not in "".join(released)
    assert stream.stopped
    assert stream.finish() == ""
    assert "".join(released) == "The answer is 42."


def test_text_before_the_stop_is_released_and_nothing_after_it() -> None:
    released, tail, stream = run_pieces(["Sure. STOP", " secret", " more"], ("STOP",))
    assert "".join(released) == "Sure. "
    assert released[1:] == ["", ""]  # after a stop, pushes release nothing
    assert tail == "" and stream.stopped


def test_stop_string_inside_a_single_token_cuts_that_token() -> None:
    released, tail, stream = run_pieces(["abc###def"], ("###",))
    assert released == ["abc"] and tail == "" and stream.stopped


def test_stop_string_at_the_very_start_releases_nothing() -> None:
    released, tail, stream = run_pieces(["##", "#", "tail"], ("###",))
    assert released == ["", "", ""] and tail == "" and stream.stopped


def test_finish_flushes_a_held_prefix_that_never_became_a_stop_string() -> None:
    released, tail, stream = run_pieces(["value: <", "|st"], ("<|stop|>",))
    assert "<" not in "".join(released)  # "<|st" could still have grown into "<|stop|>"
    assert "".join(released) + tail == "value: <|st"
    assert tail.endswith("<|st")
    assert not stream.stopped


def test_finish_after_a_stop_releases_nothing() -> None:
    stream = TextStream(PieceDecoder(["a<", "|stop|>b"]), ("<|stop|>",))
    assert stream.push(0) + stream.push(1) == "a"
    assert stream.finish() == ""
    assert stream.finish() == ""


def test_decoder_flush_text_is_checked_for_the_stop_string() -> None:
    class TrailingDecoder(PieceDecoder):
        def flush(self) -> str:
            return "op tail"

    stream = TextStream(TrailingDecoder(["go ", "st"]), ("stop",))
    out = stream.push(0) + stream.push(1)
    assert out + stream.finish() == "go "
    assert stream.stopped


def test_multibyte_characters_are_released_whole() -> None:
    released, tail, _ = run_bytes("añ日🙂", ())
    assert all("\ufffd" not in r for r in released)
    assert [r for r in released if r] == ["a", "ñ", "日", "🙂"]
    assert tail == ""


def test_a_multibyte_stop_string_fed_byte_by_byte_never_leaks() -> None:
    text = "価格は日本円です"
    stream = TextStream(ByteDecoder(), ("日本",))
    released = ""
    for b in text.encode():
        released += stream.push(b)
        assert "日" not in released
    assert stream.stopped
    assert released + stream.finish() == "価格は"


def test_a_multibyte_near_miss_is_released_at_the_end() -> None:
    released, tail, stream = run_bytes("今日曜日", ("日本",))
    assert "".join(released) + tail == "今日曜日"
    assert not stream.stopped


def test_an_incomplete_character_at_the_end_is_flushed_as_a_replacement() -> None:
    stream = TextStream(ByteDecoder(), ("zz",))
    out = stream.push(ord("a")) + stream.push(0xE6)  # first byte of a 3-byte character
    assert out + stream.finish() == "a\ufffd"


def test_each_of_several_stop_strings_stops_the_stream() -> None:
    stop = ("</answer>", "\n\n")
    for text, expected in [("x = 1</answer> junk", "x = 1"), ("x = 1\n\njunk</answer>", "x = 1")]:
        pieces = [text[i : i + 2] for i in range(0, len(text), 2)]
        released, tail, stream = run_pieces(pieces, stop)
        assert "".join(released) + tail == expected and stream.stopped


def test_with_several_stop_strings_the_earliest_match_wins_token_by_token() -> None:
    text = "abc STOP def END ghi"
    for stop in [("END", "STOP"), ("STOP", "END")]:
        released, tail, _ = run_pieces(list(text), stop)
        assert "".join(released) + tail == "abc "


@pytest.mark.parametrize("pieces", [["x = 1\n\nfoo</answer>"], ["x = 1\n", "\nfoo</answer>"]])
def test_with_several_stop_strings_the_earliest_match_wins_within_the_held_text(
    pieces: list[str],
) -> None:
    # The stop string that matches later is listed first; one push brings both into view.
    released, tail, _ = run_pieces(pieces, ("</answer>", "\n\n"))
    assert "".join(released) + tail == "x = 1"


def _cut(text: str, stop: str) -> str:
    at = text.find(stop)
    return text if at < 0 else text[:at]


def _split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points)]


@given(
    st.text(alphabet="ab日c", max_size=40),
    st.lists(st.integers(min_value=0), max_size=20),
    st.text(alphabet="ab日c", min_size=1, max_size=5),
)
def test_output_is_the_text_cut_at_the_first_stop_whatever_the_pieces(
    text: str, cuts: list[int], stop: str
) -> None:
    pieces = _split(text, cuts)
    released, tail, stream = run_pieces(pieces, (stop,))
    out = "".join(released)
    # Never released early: whatever is out so far is a prefix of the answer.
    answer = _cut(text, stop)
    assert answer.startswith(out)
    assert out + tail == answer
    assert stream.stopped == (stop in text)


@given(
    st.text(max_size=20),
    st.text(min_size=1, max_size=6),
    st.text(max_size=20),
    st.booleans(),
    st.lists(st.integers(min_value=0), max_size=12),
)
def test_any_text_and_stop_string_is_cut_at_the_first_occurrence(
    before: str, stop: str, after: str, include: bool, cuts: list[int]
) -> None:
    text = before + (stop if include else "") + after
    released, tail, _ = run_pieces(_split(text, cuts), (stop,))
    assert "".join(released) + tail == _cut(text, stop)


def _cut_first(text: str, stops: list[str]) -> str:
    found = [at for at in (text.find(s) for s in stops) if at >= 0]
    return text[: min(found)] if found else text


# When no stop string lies inside another, the earliest match is the same whichever pieces the
# text arrives in. (When one does, e.g. "b" inside "abc", the answer may depend on the pieces:
# the stream stops at whichever is complete first.)
disjoint_stops = st.lists(
    st.text(alphabet="ab日c", min_size=1, max_size=4), min_size=1, max_size=3, unique=True
).filter(lambda stops: not any(a != b and a in b for a in stops for b in stops))


@given(disjoint_stops, st.data())
def test_with_several_stop_strings_output_is_cut_at_the_earliest(
    stops: list[str], data: st.DataObject
) -> None:
    # The text is built of filler and copies of the stop strings, so matches are common.
    segment = st.sampled_from(stops) | st.text(alphabet="ab日c", max_size=6)
    text = "".join(data.draw(st.lists(segment, max_size=8)))
    cuts = data.draw(st.lists(st.integers(min_value=0), max_size=10))
    released, tail, stream = run_pieces(_split(text, cuts), tuple(stops))
    assert "".join(released) + tail == _cut_first(text, stops)
    assert stream.stopped == any(s in text for s in stops)
