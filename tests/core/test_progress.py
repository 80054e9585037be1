"""Start-up progress: plain log lines when stderr is not a terminal, a bar or a rewritten
line when it is."""

from __future__ import annotations

import io
import logging

import pytest

from ferrollm.progress import counted, step


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ferrollm.startup")
    with step("Allocating the KV cache", stream=io.StringIO()):
        pass
    with counted(10, "Loading weights", "tensor", stream=io.StringIO()) as tick:
        for _ in range(10):
            tick()
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "Allocating the KV cache..."
    assert lines[1].startswith("Allocating the KV cache: done in ")
    assert lines[2] == "Loading weights: 10 tensors..."
    # A line as each quarter is passed (at 3, 5 and 8 of 10), then the end.
    assert lines[3:6] == [
        "Loading weights: 3/10 tensors",
        "Loading weights: 5/10 tensors",
        "Loading weights: 8/10 tensors",
    ]
    assert lines[6].startswith("Loading weights: 10/10 tensors in ")
    assert len(lines) == 7


def test_a_terminal_gets_a_bar_and_no_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ferrollm.startup")
    terminal = Terminal()
    with step("Profiling a step", stream=terminal):
        pass
    with counted(4, "Loading weights", "tensor", stream=terminal) as tick:
        for _ in range(4):
            tick()
    text = terminal.getvalue()
    assert "Profiling a step...\rProfiling a step: done in " in text
    assert "Loading weights" in text and "4/4" in text  # tqdm's bar
    assert caplog.records == []


def test_the_step_ends_its_line_when_it_fails(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="ferrollm.startup")
    with pytest.raises(RuntimeError), step("Compiling", stream=io.StringIO()):
        raise RuntimeError("boom")
    assert caplog.records[-1].getMessage().startswith("Compiling: failed after ")
