"""The agent's output logs: bounded, head and tail kept, the cut said."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_exec, write_agent

from ccm_guard.agent import runner


def test_a_log_keeps_its_head_and_tail_and_says_what_was_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "LOG_HEAD", 10)
    monkeypatch.setattr(runner, "LOG_TAIL", 8)
    log = runner.CappedLog(tmp_path / "out.log")
    for chunk in (b"0123456", b"789abcdef", b"ghijk", b"lmnopqrstuvwxyz"):
        log.write(chunk)
    log.close()
    text = (tmp_path / "out.log").read_bytes()
    head, marker, tail = text.partition(b"\n[ccm-guard: ")
    assert head == b"0123456789" and tail.endswith(b"]\nstuvwxyz")
    cut = len(b"0123456789abcdefghijklmnopqrstuvwxyz") - 10 - 8
    assert marker and tail.startswith(f"{cut} bytes of output cut here".encode())


def test_a_short_log_is_kept_whole(tmp_path: Path) -> None:
    log = runner.CappedLog(tmp_path / "out.log")
    log.write(b"hello\n")
    log.close()
    assert (tmp_path / "out.log").read_bytes() == b"hello\n"


def test_an_agent_printing_more_than_the_bound_leaves_a_bounded_log(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "head -c 20000000 /dev/zero | tr '\\0' x; echo; echo THE-END\n")
    res = run_exec(repo, agent, "--sandbox", "none", "--no-require-commit", timeout=120)
    log = Path(res.verdict["log_dir"], "agent.stdout.log").read_bytes()
    assert len(log) < runner.LOG_HEAD + runner.LOG_TAIL + 200
    assert log.endswith(b"THE-END\n") and b"bytes of output cut here" in log
