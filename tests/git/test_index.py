"""git.index.trust_unchanged: a fresh checkout's racily clean entries, proven unchanged to the
nanosecond, are trusted; anything written after the copy of the index is still read by git."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from conftest import git

from ccm_guard.git.index import entries, trust_unchanged

FILES = 20


@pytest.fixture(params=[2, 4], ids=["index-v2", "index-v4"])
def version(request: pytest.FixtureRequest) -> int:
    """The index versions: 2, git's own; 4 (paths prefix-compressed), which feature.manyFiles sets."""
    return int(request.param)


def _checked_out(tmp_path: Path, version: int = 2) -> tuple[Path, Path, int]:
    """A work tree just checked out, ccm-guard's copy of its index, and when the copy was
    made (ns). Every entry is racily clean: the index's mtime is put in the second of the
    oldest file, as when git writes files and index within one second."""
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "index.version", str(version))
    for i in range(FILES):
        (repo / f"f{i}.txt").write_text(f"file {i}\n")
    (repo / "link").symlink_to("f0.txt")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "files")
    for path in [*repo.glob("f*.txt"), repo / "link"]:
        path.unlink()
    git(repo, "reset", "-q", "--hard")
    index = repo / ".git" / "index"
    oldest = min(os.lstat(p).st_mtime_ns for p in [*repo.glob("f*.txt"), repo / "link"])
    os.utime(index, ns=(oldest, oldest))
    time.sleep(0.05)  # past the clock's tick: the copy is later than every file
    copy = tmp_path / "index.copy"
    shutil.copy2(index, copy)
    return repo, copy, os.lstat(copy).st_ctime_ns


def _private(tmp_path: Path, copy: Path) -> Path:
    private = tmp_path / "index.private"
    shutil.copy2(copy, private)
    return private


def _sizes(index: Path) -> dict[str, int]:
    """path -> the size its entry records (0: smudged, git reads the file)."""
    found = entries(index.read_bytes())
    assert found is not None
    return {path.decode(): fields[9] for _, fields, _, path in found}


def _status(repo: Path, index: Path) -> str:
    return git(repo, "status", "--porcelain", env={"GIT_INDEX_FILE": str(index)})


def test_a_fresh_checkout_is_trusted_as_it_is(tmp_path: Path, version: int) -> None:
    repo, copy, made = _checked_out(tmp_path, version)
    assert len(_sizes(copy)) == FILES + 1
    private = _private(tmp_path, copy)
    mark = trust_unchanged(private, repo, written_before_ns=made)
    assert mark is not None and os.stat(private).st_mtime_ns == mark
    assert mark // 1_000_000_000 > max(os.lstat(p).st_mtime_ns for p in repo.glob("f*.txt")) // 1_000_000_000
    assert _sizes(private) == _sizes(copy) and 0 not in _sizes(private).values()  # nothing smudged
    assert _status(repo, private) == ""
    git(repo, "ls-files", "--stage", env={"GIT_INDEX_FILE": str(private)})  # git takes the rewritten file


def test_a_file_written_after_the_copy_is_read_by_git(tmp_path: Path, version: int) -> None:
    """Rewritten in place with its size and its mtime put back to the nanosecond, and one
    replaced by a new file of the same size: git, trusting whole seconds, would take both
    for clean once the index is newer; each is smudged instead, the rest kept."""
    while time.time() % 1 > 0.3:  # all of it within one second, as an agent quick enough would be
        time.sleep(0.05)
    repo, copy, made = _checked_out(tmp_path, version)
    edited, replaced = repo / "f3.txt", repo / "f4.txt"
    before = os.lstat(edited)
    edited.write_text("FILE 3\n")
    os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.lstat(edited).st_ctime_ns // 10**9 == before.st_ctime_ns // 10**9, "the test took over a second"
    (repo / "new").write_text("FILE 4\n")
    os.replace(repo / "new", replaced)
    blind = _private(tmp_path, copy)  # what moving the mtime alone would do: git misses the edit
    os.utime(blind, ns=(time.time_ns() + 10**10,) * 2)
    assert _status(repo, blind) == "M f4.txt"  # (a new inode it sees)

    private = _private(tmp_path, copy)
    assert trust_unchanged(private, repo, written_before_ns=made) is not None
    sizes = _sizes(private)
    assert sizes["f3.txt"] == sizes["f4.txt"] == 0
    assert {path for path, size in sizes.items() if size == 0} == {"f3.txt", "f4.txt"}
    assert sorted(line.strip() for line in _status(repo, private).splitlines()) == ["M f3.txt", "M f4.txt"]


def test_a_clock_ahead_at_the_copy_proves_no_edit_away(tmp_path: Path) -> None:
    """However the clocks of the copy and the work tree disagree (a network file system's
    server behind, a clock stepped back), an edit within the checkout's second, its mtime
    put back, is still read: only the exact match to the nanosecond proves an entry."""
    while time.time() % 1 > 0.3:
        time.sleep(0.05)
    repo, copy, made = _checked_out(tmp_path)
    edited = repo / "f3.txt"
    before = os.lstat(edited)
    edited.write_text("FILE 3\n")
    os.utime(edited, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.lstat(edited).st_ctime_ns // 10**9 == before.st_ctime_ns // 10**9, "the test took over a second"
    private = _private(tmp_path, copy)
    assert trust_unchanged(private, repo, written_before_ns=made + 10**9) is not None  # the copy a second ahead
    assert _sizes(private)["f3.txt"] == 0
    assert _status(repo, private) == "M f3.txt"


def test_entries_changed_no_earlier_than_the_copy_are_all_read(tmp_path: Path) -> None:
    """An entry whose change time is not before the copy proves nothing: a writer in the
    same clock tick would leave the same times behind."""
    repo, copy, _ = _checked_out(tmp_path)
    private = _private(tmp_path, copy)
    oldest = min(os.lstat(p).st_ctime_ns for p in [*repo.glob("f*.txt"), repo / "link"])
    assert trust_unchanged(private, repo, written_before_ns=oldest) is not None
    assert set(_sizes(private).values()) == {0}
    assert _status(repo, private) == ""  # read, and found as checked out


def test_an_entry_without_nanoseconds_is_read(tmp_path: Path) -> None:
    """A file system that keeps whole seconds proves nothing to the nanosecond."""
    repo, copy, made = _checked_out(tmp_path)
    data = bytearray(copy.read_bytes())
    data[16:20] = data[24:28] = bytes(4)  # the first entry's ctime and mtime nanoseconds (after the header)
    private = tmp_path / "index.private"
    private.write_bytes(bytes(data))
    os.utime(private, ns=(os.stat(copy).st_mtime_ns,) * 2)
    assert trust_unchanged(private, repo, written_before_ns=made) is not None
    sizes = list(_sizes(private).values())
    assert sizes[0] == 0 and 0 not in sizes[1:]


def test_an_index_it_does_not_read_or_with_a_flag_is_left_alone(tmp_path: Path) -> None:
    repo, copy, made = _checked_out(tmp_path)
    index = repo / ".git" / "index"
    for change in (["--skip-worktree", "f1.txt"], ["--no-skip-worktree", "f1.txt", "--split-index"]):
        git(repo, "update-index", *change)
        private = tmp_path / "index.private"
        shutil.copy2(index, private)
        os.utime(private, ns=(os.stat(copy).st_mtime_ns,) * 2)
        kept = private.read_bytes(), os.stat(private).st_mtime_ns
        assert trust_unchanged(private, repo, written_before_ns=made) is None, change
        assert (private.read_bytes(), os.stat(private).st_mtime_ns) == kept
