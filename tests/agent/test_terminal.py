"""The escape sequences that act on the person's terminal are not passed on."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import read_terminal, write_agent

from ccm_guard.agent import terminal
from ccm_guard.agent.terminal import TerminalFilter

CLIP = b"\x1b]52;c;ZWNobyBwd25lZA==\x07"  # "echo pwned" for the clipboard


def shown(*chunks: bytes) -> tuple[bytes, TerminalFilter]:
    f = TerminalFilter()
    out = b"".join(f.feed(c) for c in chunks)
    f.finish()
    return out, f


def test_clipboard_writes_are_dropped_and_drawing_passes() -> None:
    title, link = b"\x1b]0;my title\x07", b"\x1b]8;;https://example.com\x1b\\x\x1b]8;;\x1b\\"
    out, f = shown(b"\x1b[31mred\x1b[0m " + CLIP + title + link + b"\x1b]52;c;?\x1b\\done")
    assert out == b"\x1b[31mred\x1b[0m " + title + link + b"done"
    assert f.dropped == 2


@pytest.mark.parametrize("cut", range(1, len(CLIP)))
def test_a_sequence_split_across_reads_is_still_dropped(cut: int) -> None:
    out, f = shown(b"a" + CLIP[:cut], CLIP[cut:] + b"b")
    assert out == b"ab" and f.dropped == 1


@pytest.mark.parametrize("number", [b"50", b"1337", b"5113"])
def test_font_and_file_transfer_sequences_are_dropped(number: bytes) -> None:
    assert shown(b"\x1b]" + number + b";File=x:AAAA\x07ok")[0] == b"ok"


def test_an_unterminated_sequence_is_held_then_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shown(b"before\x1b]0;open title, never closed")[0] == b"before"
    monkeypatch.setattr(terminal, "OSC_LIMIT", 16)
    f = TerminalFilter()
    assert f.feed(b"x\x1b]52;" + b"A" * 32) == b"x" and f.feed(b"\x07after") == b"\x07after"


def test_the_pty_proxy_keeps_clipboard_writes_from_the_terminal(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "printf 'hello \\033]52;c;ZWNobyBwd25lZA==\\007world\\n'\n")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--sandbox", "none", "--pty",
                             "--no-require-commit", "--", str(agent)], cwd=repo,
                            stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = read_terminal(leader)
    proc.wait(timeout=60)
    assert b"hello " in out and b"world" in out  # the agent's output reached the terminal
    assert b"]52;" not in out


@pytest.mark.parametrize("data", [
    b"\x1b]0;title\x1b]52;c;ZWNobyBwd25lZA==\x07after",  # an OSC 52 inside an OSC the ESC aborts
    b"\x1b]052;c;ZWNobyBwd25lZA==\x07after",  # the number as terminals read it
    b"\x1b]5522;type=write\x07after",  # kitty's clipboard
    b"\x1b]0;aborted\x18after",  # CAN aborts an OSC
])
def test_sequences_terminals_would_act_on_are_dropped_however_spelled(data: bytes) -> None:
    out, f = shown(data)
    assert out == b"after" and f.dropped >= 1


def test_an_osc_aborted_by_another_sequence_leaves_that_sequence() -> None:
    assert shown(b"\x1b]0;t\x1b[31mred")[0] == b"\x1b[31mred"
