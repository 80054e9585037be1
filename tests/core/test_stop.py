"""The stop matcher through the binding: the streamed text equals the whole-text result for any
split into deltas, the hold-back is minimal, and the table of concrete cases."""

import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferrollm import StopMatcher, ValidationError
from ferrollm.testing import truncate_at_stop


def first_stop(text: str, stop: list[str], include: bool) -> tuple[str, str | None]:
    """The stop rule by brute force over end positions: earliest end, then longest, then first."""
    for end in range(len(text) + 1):
        ending = [s for s in stop if text.endswith(s, 0, end)]
        if ending:
            best = max(ending, key=len)
            return (text[:end] if include else text[: end - len(best)]), best
    return text, None


def stream(stop: list[str], include: bool, deltas: list[str]) -> tuple[str, str | None]:
    m = StopMatcher(stop, include)
    out, matched = [], None
    for delta in deltas:
        text, got = m.push(delta)
        out.append(text)
        if got is not None:
            assert matched is None, "matched twice"
            matched = got
    out.append(m.finish())
    assert m.stopped == (matched is not None)
    return "".join(out), matched


@pytest.mark.parametrize(
    ("stop", "include", "deltas", "expected"),
    [
        (["STOP"], False, ["abc ST", "O", "P def"], ("abc ", "STOP")),
        (["STOP"], True, ["abc ST", "O", "P def"], ("abc STOP", "STOP")),
        (["abcd", "bc"], False, ["xabcd"], ("xa", "bc")),
        (["abcd", "bc"], True, ["x", "a", "b", "c", "d"], ("xabc", "bc")),
        (["c", "abc"], False, ["zab", "c"], ("z", "abc")),
        (["stop"], False, ["stop"], ("", "stop")),
        (["<"], True, ["<abc"], ("<", "<")),
        (["日本語"], False, ["こんにちは日本", "語です"], ("こんにちは", "日本語")),
        (["ü!"], False, ["café", "ü", "!"], ("café", "ü!")),
        (["Hello!"], False, ["Hel", "p"], ("Help", None)),
        (["<|im_end|>"], False, ["answer<|im", "_end|> more"], ("answer", "<|im_end|>")),
        ([], True, ["no stops ", "here"], ("no stops here", None)),
    ],
)
def test_cases(
    stop: list[str], include: bool, deltas: list[str], expected: tuple[str, str | None]
) -> None:
    assert stream(stop, include, deltas) == expected
    assert truncate_at_stop("".join(deltas), stop, include) == expected


def test_hold_back_is_released_as_soon_as_possible() -> None:
    m = StopMatcher(["Hello!"])
    assert m.push("Hel") == ("", None)
    assert m.held == "Hel"
    assert m.push("p me, Hel") == ("Help me, ", None)
    assert m.held == "Hel"
    assert m.push("lo!") == ("", "Hello!")
    assert (m.stopped, m.held) == (True, "")
    assert m.push("ignored") == ("", None)
    assert m.finish() == ""


def test_finish_flushes_and_ends_the_stream() -> None:
    m = StopMatcher(["END"], include_stop_str_in_output=True)
    assert m.push("x EN") == ("x ", None)
    assert m.finish() == "EN"
    assert m.push("D") == ("", None)
    assert not m.stopped


@pytest.mark.parametrize(
    "call", [lambda: StopMatcher(["ok", ""]), lambda: truncate_at_stop("t", [""])]
)
def test_empty_stop_string_is_rejected(call: Callable[[], object]) -> None:
    with pytest.raises(ValidationError) as info:
        call()
    assert (info.value.param, info.value.code) == ("stop", "empty")
    assert "`stop[" in str(info.value)


def test_wrong_types_raise_type_error() -> None:
    with pytest.raises(TypeError):
        StopMatcher("a string is not a list of stops")
    with pytest.raises(TypeError):
        StopMatcher(["x"]).push(b"bytes")  # type: ignore[arg-type]


ALPHABET = st.sampled_from(["a", "b", "c", "é", "日"])


@settings(max_examples=400, deadline=None)
@given(
    text=st.lists(ALPHABET, max_size=40).map("".join),
    cuts=st.lists(st.integers(0, 40), max_size=12),
    stop=st.lists(st.lists(ALPHABET, min_size=1, max_size=6).map("".join), max_size=5),
    include=st.booleans(),
)
def test_streaming_equals_the_whole_text_result(
    text: str, cuts: list[int], stop: list[str], include: bool
) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    deltas = [text[a:b] for a, b in itertools.pairwise(bounds)]
    expected = first_stop(text, stop, include)
    assert truncate_at_stop(text, stop, include) == expected

    m = StopMatcher(stop, include)
    out, seen, matched = "", "", None
    for delta in deltas:
        emitted, got = m.push(delta)
        matched = matched or got
        out += emitted
        assert expected[0].startswith(out), "emitted text was withdrawn"
        if not m.stopped:
            seen += delta
            assert out + m.held == seen
            # Minimal hold-back: the longest suffix that is a proper prefix of some stop.
            held = max(
                (
                    k
                    for k in range(len(seen) + 1)
                    if any(len(s) > k and s.startswith(seen[len(seen) - k :]) for s in stop)
                ),
                default=0,
            )
            assert len(m.held) == held
    out += m.finish()
    assert (out, matched) == expected
    assert m.stopped == (expected[1] is not None)
