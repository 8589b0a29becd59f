"""Progress on stderr: shown for a slow step on a terminal; nothing for a quick step, off a
terminal, or under --json."""

from __future__ import annotations

import io
import os
import pty
import select
import sys
import time

import pytest

from ccm_guard import progress


def _on_a_terminal(monkeypatch: pytest.MonkeyPatch, seconds: float, quiet: bool = False) -> str:
    master, slave = pty.openpty()
    monkeypatch.setattr(sys, "stderr", open(slave, "w", closefd=True))
    monkeypatch.setattr(progress, "DELAY", 0.05)
    monkeypatch.setattr(progress, "_quiet", quiet)
    with progress.step("checking out the task's worktree"):
        time.sleep(seconds)
    sys.stderr.flush()
    shown = b""
    try:  # a terminal hands its output over in pieces: read until it has been quiet a while
        while select.select([master], [], [], 0.5)[0]:
            shown += os.read(master, 65536)
    finally:
        os.close(master)
    return shown.decode()


def test_a_slow_step_shows_progress_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    shown = _on_a_terminal(monkeypatch, 0.3)
    assert "ccm-guard: checking out the task's worktree... 0s" in shown
    assert "checking out the task's worktree: done in 0." in shown and shown.endswith("\n")


def test_a_quick_step_or_json_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _on_a_terminal(monkeypatch, 0.0) == ""
    assert _on_a_terminal(monkeypatch, 0.3, quiet=True) == ""


def test_nothing_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    captured = io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    monkeypatch.setattr(progress, "DELAY", 0.01)
    with progress.step("archiving"):
        time.sleep(0.1)
    assert captured.getvalue() == ""
