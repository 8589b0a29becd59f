"""ccm_guard.files.replace_file: the one way ccm-guard writes a file whole beside what an
agent may have planted (hooks, restored config, the agent's home, the state home)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ccm_guard.files import replace_file


def test_a_file_is_replaced_whole_with_exactly_its_mode(tmp_path: Path) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    target = hooks / "hook"
    target.write_text("old\n")
    mask = os.umask(0o077)  # the mode is the one asked for, whatever the umask
    try:
        replace_file(target, b"new\n", 0o755)
    finally:
        os.umask(mask)
    assert target.read_bytes() == b"new\n" and target.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in hooks.iterdir()] == ["hook"]  # no temp file stays


@pytest.mark.parametrize("planted", ["symlink", "hardlink"])
def test_nothing_planted_at_the_temp_name_is_written_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             planted: str) -> None:
    """Were the temp name guessed (here it is made predictable), a link planted there is
    refused, not followed: the person's file keeps its bytes, and the target is untouched."""
    monkeypatch.setattr(os, "urandom", lambda n: b"\0" * n)
    persons, target = tmp_path / "bashrc", tmp_path / "config"
    persons.write_text("the person's\n")
    target.write_text("before\n")
    guessed = tmp_path / f".config.{os.getpid()}-00000000.ccm-guard-tmp"
    if planted == "symlink":
        guessed.symlink_to(persons)
    else:
        os.link(persons, guessed)
    with pytest.raises(FileExistsError):
        replace_file(target, b"after\n")
    assert persons.read_text() == "the person's\n" and target.read_text() == "before\n"
