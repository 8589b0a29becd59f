"""A lock file another task's git has closed but not yet renamed into place is in flight,
not left behind (detect/gates/repo._unheld): seen as a failure in a CI run of ten tasks at
once, where one task's commit was caught between the two by another's gates."""

from __future__ import annotations

import threading
from pathlib import Path

from ccm_guard.detect.gates.repo import _unheld


def test_a_lock_that_goes_within_the_grace_is_not_left(tmp_path: Path) -> None:
    lock = tmp_path / "t3.lock"
    lock.write_text("0" * 40 + "\n")
    timer = threading.Timer(0.15, lock.unlink)  # renamed into place a moment later
    timer.start()
    try:
        assert _unheld([str(lock)], lambda paths: set()) == {}
    finally:
        timer.join()


def test_a_lock_that_stays_is_left_and_one_held_open_is_not(tmp_path: Path) -> None:
    stays, held = tmp_path / "stays.lock", tmp_path / "held.lock"
    stays.write_text("")
    held.write_text("")
    found = _unheld([str(stays), str(held)], lambda paths: {str(held)} & paths)
    assert list(found) == [str(stays)]
