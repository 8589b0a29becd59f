"""The disk-room check before a fresh checkout: its estimate (files and bytes, from the
person's index) is kept under the index file's identity, so that an unchanged index is
not read again on every run, and a changed, missing or garbled record is never used."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import git, no_disk_room

from ccm_guard import worktree
from ccm_guard.errors import RepoError
from ccm_guard.git import index as indexfile


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The index files the check read (each call of git.index.sizes)."""
    seen: list[Path] = []
    real = indexfile.sizes

    def counted(path: Path, oid_len: int = 20) -> tuple[int, int] | None:
        seen.append(path)
        return real(path, oid_len)

    monkeypatch.setattr(indexfile, "sizes", counted)
    return seen


def _plan(repo: Path, task: str) -> worktree.Plan:
    return worktree.plan(repo, task, "HEAD")


def _kept(repo: Path) -> Path:
    [record] = (Path(os.environ["CCM_GUARD_HOME"]) / "index-sizes").iterdir()
    return record


def test_an_unchanged_index_is_read_once(repo: Path, reads: list[Path]) -> None:
    worktree.check_disk(_plan(repo, "a"))
    worktree.check_disk(_plan(repo, "b"))
    assert len(reads) == 1
    assert [int(field) for field in _kept(repo).read_text().split()[2:]] == list(_sizes_of(repo))


def _sizes_of(repo: Path) -> tuple[int, int]:
    listed = git(repo, "ls-files", "-z").split("\0")
    paths = [repo / name for name in listed if name]
    return len(paths), sum(p.stat().st_size for p in paths)


def test_a_changed_index_is_read_again(repo: Path, reads: list[Path]) -> None:
    worktree.check_disk(_plan(repo, "a"))
    (repo / "more.txt").write_text("x" * 5000)
    git(repo, "add", "more.txt")
    worktree.check_disk(_plan(repo, "b"))
    assert len(reads) == 2
    assert [int(field) for field in _kept(repo).read_text().split()[2:]] == list(_sizes_of(repo))


@pytest.mark.parametrize("record", ["", "garbage", "id:1:2:3:4 20 1 2\n", "id:1:2:3:4 20 x y\n", "\0" * 300])
def test_a_record_for_another_index_or_garbled_is_not_used(repo: Path, reads: list[Path], record: str) -> None:
    worktree.check_disk(_plan(repo, "a"))
    kept = _kept(repo)
    if record:
        kept.write_text(record)
    else:
        kept.unlink()
    worktree.check_disk(_plan(repo, "b"))
    assert len(reads) == 2
    assert [int(field) for field in kept.read_text().split()[2:]] == list(_sizes_of(repo))


def test_a_refused_checkout_keeps_no_record(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_disk_room(monkeypatch)
    with pytest.raises(RepoError, match="not enough disk space for the checkout"):
        worktree.check_disk(_plan(repo, "a"))
    assert not (Path(os.environ["CCM_GUARD_HOME"]) / "index-sizes").exists()


def test_a_kept_record_still_refuses_what_does_not_fit(repo: Path, monkeypatch: pytest.MonkeyPatch,
                                                       reads: list[Path]) -> None:
    worktree.check_disk(_plan(repo, "a"))
    kept = _kept(repo)
    key = " ".join(kept.read_text().split()[:2])
    kept.write_text(f"{key} 1 {10**15}\n")  # a petabyte: the figures are the record's, unread
    with pytest.raises(RepoError, match="not enough disk space for the checkout"):
        worktree.check_disk(_plan(repo, "b"))
    assert len(reads) == 1
