"""Removal off the critical path: one rename into the trash, deletion after ccm-guard exits."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT, git, make_repo, run_exec, write_agent

from ccm_guard.state import trash

# A process that moves a directory into the trash and then waits for a line on stdin: it
# stands for a ccm-guard that has removed a worktree and has not answered yet.
HOLDER = """
import sys
from pathlib import Path
from ccm_guard.state import trash
entry = trash.discard(Path(sys.argv[1]))
print(entry, flush=True)
sys.stdin.readline()
"""


def wait_until(condition: Callable[[], object], what: str, seconds: float = 60) -> None:
    """Poll for something that happens in the background (not a timing assertion)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {what}")
        time.sleep(0.05)


def tree_of_files(root: Path, count: int = 50) -> Path:
    for i in range(count):
        d = root / f"d{i % 5}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}").write_text(f"{i}\n")
    return root


def holder(directory: Path) -> tuple[subprocess.Popen[str], Path]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    entry = Path(proc.stdout.readline().strip())
    return proc, entry


def test_cleanup_renames_the_worktree_into_the_trash_and_git_forgets_it(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo more >> README.md\ngit commit -qam 'more'")
    result = run_exec(repo, agent, "--no-pool", "--cleanup", "--task", "gone")
    assert result.code == 0, result.stderr
    worktree = Path(result.verdict["worktree"])
    assert not worktree.exists()
    assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
    assert git(repo, "worktree", "prune", "--dry-run", "--verbose") == ""  # no stale admin entry either
    assert git(repo, "branch", "--list", "ccm/gone") == ""
    assert git(repo, "rev-parse", "refs/ccm-guard/archive/gone") == result.verdict["head"]
    wait_until(lambda: trash.entries() == [], "the deleter to empty the trash after exec exited")


def test_deletion_waits_for_the_process_to_exit_and_survives_it(tmp_path: Path) -> None:
    proc, entry = holder(tree_of_files(tmp_path / "big"))
    try:
        assert not (tmp_path / "big").exists()
        assert entry.parent == trash.trash_dir() and (entry / "d0" / "f0").read_text() == "0\n"
        # The holder has not exited: no deleter exists yet (one started now would be a
        # child of ccm-guard while its agent runs, and the processes gate would kill it).
        assert entry.exists() and not trash.busy(entry)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)
    wait_until(lambda: not entry.exists(), "the deleter to delete the entry once its process exited")


def test_a_killed_process_leaves_its_trash_to_sweep(tmp_path: Path) -> None:
    proc, entry = holder(tree_of_files(tmp_path / "big"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert entry.exists()
    report = trash.sweep(wait=False)  # handed to a detached deleter
    assert report.deleted == [str(entry)]
    wait_until(lambda: not entry.exists(), "the sweep's deleter to delete the killed process's entry")


def test_the_deleter_holds_its_entries_locks_until_it_is_done(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """The locks are taken by the process that starts the deleter and handed to rm: the
    starter lets go at once, and a sweep meanwhile still leaves the entry to the deleter.
    (An rm that takes its time and deletes nothing stands in for a large tree.)"""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "rm").write_text("#!/bin/sh\nsleep 1\n")
    (fake / "rm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    entry = tree_of_files(trash.trash_dir() / "1-1-abcdef-held", 3)
    trash._start_deleter({entry: 0})
    assert trash.busy(entry) and trash.sweep().busy == [str(entry)]
    wait_until(lambda: not trash.busy(entry), "the deleter to let go when it exits")
    assert entry.exists()  # (the stand-in deleted nothing)


def test_without_nice_the_deleter_is_rm_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    said = tmp_path / "said"
    (fake / "rm").write_text(f"#!/bin/sh\necho \"$@\" > {said}\n")  # (no nice on this PATH)
    (fake / "rm").chmod(0o755)
    monkeypatch.setenv("PATH", str(fake))
    entry = tree_of_files(trash.trash_dir() / "1-1-abcdef-plain", 3)
    trash._start_deleter({entry: 0})
    wait_until(said.exists, "rm to be started")
    wait_until(lambda: said.read_text().strip() == f"-rf --one-file-system -- {entry}", "rm's arguments")


def test_more_entries_than_open_files_allowed_are_all_deleted(tmp_path: Path) -> None:
    """A gc that expires many tasks hands the deleter more entries than a process may hold
    locks on at once (here 400 open files, 1100 entries): a deleter a chunk, each started
    with its chunk's locks, and every entry goes."""
    for i in range(1100):
        (trash.trash_dir() / f"{i}-1-abcdef-t{i}").mkdir(parents=True)
    code = """import resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (400, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from ccm_guard.state import trash
trash._start_deleter(dict.fromkeys(trash.entries(), 0))
"""
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wait_until(lambda: trash.entries() == [], "the deleters to delete all 1100 entries")


def test_sweep_deletes_what_a_crash_left_and_skips_entries_being_deleted(tmp_path: Path) -> None:
    left = trash.trash_dir() / "1-1-abcdef-crashed"
    tree_of_files(left, 10)
    busy = trash.trash_dir() / "2-2-abcdef-busy"
    tree_of_files(busy, 10)
    fd = os.open(busy, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as a deleter at work holds it
    try:
        assert trash.sweep(dry_run=True).deleted == [str(left)] and left.exists()
        report = trash.sweep()
        assert report.deleted == [str(left)] and report.busy == [str(busy)]
        assert not left.exists() and busy.exists()
    finally:
        os.close(fd)
    assert trash.sweep().deleted == [str(busy)] and trash.entries() == []


def test_remove_worktree_is_git_worktree_remove_minus_the_deletion(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    worktree = tmp_path / "wts" / "one"
    git(repo, "worktree", "add", "-q", "-b", "one", str(worktree))
    (worktree / "untracked.txt").write_text("x\n")
    admin = repo / ".git" / "worktrees" / "one"
    entry = trash.remove_worktree(worktree, admin)
    try:
        assert entry is not None and (entry / "untracked.txt").exists()
        assert not worktree.exists() and not admin.exists() and not worktree.parent.exists()
        assert git(repo, "worktree", "list", "--porcelain").count("worktree ") == 1
        assert git(repo, "worktree", "prune", "--dry-run", "--verbose") == ""
    finally:
        trash.release()  # this test process lives on: let its deleter start now
    wait_until(lambda: not entry.exists(), "the deleter to delete the removed worktree")


def test_an_admin_dir_naming_another_worktree_is_left_alone(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "worktree", "add", "-q", "-b", "two", str(tmp_path / "two"))
    admin = repo / ".git" / "worktrees" / "two"
    stranger = tmp_path / "elsewhere"
    stranger.mkdir()
    assert not trash.drop_admin(admin, stranger)
    assert (admin / "gitdir").exists()
    assert trash.drop_admin(admin, tmp_path / "two") and not admin.exists()


def test_across_file_systems_the_directory_is_deleted_at_once(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another file system than the state home")
    victim = Path(subprocess.check_output(["mktemp", "-d", "-p", str(shm)], text=True).strip())
    tree_of_files(victim, 5)
    assert trash.discard(victim) is None
    assert not victim.exists() and trash.entries() == []


def test_pool_status_lists_the_trash(tmp_path: Path) -> None:
    proc, entry = holder(tree_of_files(tmp_path / "big"))
    try:
        out = subprocess.run([sys.executable, "-m", "ccm_guard", "pool", "status", "--json"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        assert json.loads(out)["trash"] == [str(entry)]
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def logging_rm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`rm` on PATH that writes each call's arguments (a line) to the file returned, then
    runs the real rm: who deleted what is seen, and the deletion is real."""
    fake, said = tmp_path / "bin", tmp_path / "rm-calls"
    fake.mkdir()
    real = subprocess.run(["sh", "-c", "command -v rm"], capture_output=True, text=True, check=True).stdout.strip()
    (fake / "rm").write_text(f'#!/bin/sh\necho "$*" >> {said}\nexec {real} "$@"\n')
    (fake / "rm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    return said


def _shared_deletion(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, work: Path, files: int) -> list[list[str]]:
    """Delete `work` as a large tree, two rm processes at once; the names each rm call
    but the last (the entry itself) was given."""
    said = logging_rm(tmp_path, monkeypatch)
    monkeypatch.setattr(trash, "_SHARED_FROM", 10)
    monkeypatch.setattr(trash, "_SHARERS", 2)
    entry = trash.discard(work, files=files)
    assert entry is not None
    trash.release()
    wait_until(lambda: trash.entries() == [], "the shared deleter to empty the trash")
    calls = said.read_text().splitlines()
    assert all(call.startswith("-rf --one-file-system -- ") for call in calls)
    assert calls[-1] == f"-rf --one-file-system -- {entry}"  # the rest, once the parts are gone
    return [call.split(" -- ")[1].split() for call in calls[:-1]]  # bare names, rm run in the tree


def test_a_large_tree_is_shared_among_several_rm_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry known to hold many files: the names in its top directory go to xargs,
    which runs rm on them a few at a time, side by side; one rm takes what is left, and
    all of it goes. (That the lock is held meanwhile: test_the_exiting_process_does_not_wait_on_a_shared_deleter.)"""
    work = tmp_path / "work"
    for i in range(30):
        (work / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
        (work / f"d{i % 10}" / f"f{i}").write_text(f"{i}\n")
    calls = _shared_deletion(tmp_path, monkeypatch, work, files=30)
    assert len(calls) > 1
    assert sorted(part for call in calls for part in call) == sorted(f"d{i}" for i in range(10))


def test_a_tree_under_few_directories_is_opened_up_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree under one `src/`: what it holds is moved up into the top directory (renamed),
    so that there is something to share; nothing is given to rm by a deeper path."""
    work = tree_of_files(tmp_path / "work" / "src", 40).parent  # src/d0..d4, eight files each
    calls = _shared_deletion(tmp_path, monkeypatch, work, files=40)
    parts = [part for call in calls for part in call]
    assert len(calls) > 1 and "src" in parts and all("/" not in part for part in parts)
    # d0..d4 moved up, then their forty files: twice, for there were still fewer than 4 directories
    assert len([part for part in parts if part.startswith(".ccm-guard-part-")]) == 45


def test_a_shared_deletion_follows_no_link_out_of_the_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent left links in its worktree's top directory to a directory of the
    person's and to one of their files: only the links go."""
    monkeypatch.setattr(trash, "_SHARED_FROM", 10)
    monkeypatch.setattr(trash, "_SHARERS", 2)
    persons = tree_of_files(tmp_path / "persons", 10)
    work = tree_of_files(tmp_path / "work", 20)
    (work / "to-dir").symlink_to(persons)
    (work / "to-file").symlink_to(persons / "d0" / "f0")
    (work / "d1" / "deeper").symlink_to(persons / "d1")
    trash.discard(work, files=20)
    trash.release()
    wait_until(lambda: trash.entries() == [], "the shared deleter to empty the trash")
    assert sorted(p.relative_to(persons).as_posix() for p in persons.rglob("*") if p.is_file()) == \
        sorted(f"d{i % 5}/f{i}" for i in range(10))


def test_without_xargs_a_large_tree_still_goes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no xargs (a minimal system), the final rm takes the whole tree."""
    monkeypatch.setattr(trash, "_SHARED_FROM", 10)
    monkeypatch.setattr(trash, "_SHARERS", 2)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "rm", "nice"):
        found = subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True, text=True).stdout.strip()
        if found:
            (bin_dir / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(bin_dir))
    shared: list[str] = []
    real = trash._spawn_shared

    def spied(entry: str, fds: list[int]) -> None:
        shared.append(entry)
        real(entry, fds)

    monkeypatch.setattr(trash, "_spawn_shared", spied)
    entry = trash.discard(tree_of_files(tmp_path / "work", 30), files=30)
    trash.release()
    wait_until(lambda: trash.entries() == [], "the final rm to empty the trash")
    assert shared == [str(entry)]  # the shared deleter's way, not the plain rm's


def test_remove_worktree_says_how_many_files_the_tree_holds(repo: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The count comes from the worktree's index (its header), read before its admin dir goes."""
    seen: dict[Path, int] = {}
    monkeypatch.setattr(trash, "_start_deleter", lambda entries: seen.update(entries))
    for i in range(7):
        (repo / f"f{i}.txt").write_text(f"{i}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "files")
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", str(worktree))
    admin = Path(git(repo, "rev-parse", "--absolute-git-dir")) / "worktrees" / "wt"
    tracked = len(git(repo, "ls-files").splitlines())
    entry = trash.remove_worktree(worktree, admin)
    trash.release()
    assert entry is not None and seen == {entry: tracked}


def test_a_sparse_worktree_is_not_counted_by_its_index(repo: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A sparse checkout's index lists the files it leaves out too: no count is given."""
    seen: dict[Path, int] = {}
    monkeypatch.setattr(trash, "_start_deleter", lambda entries: seen.update(entries))
    worktree = tmp_path / "wt"
    git(repo, "worktree", "add", "-q", "--no-checkout", str(worktree))
    git(worktree, "sparse-checkout", "set", "--cone", "nothing")
    git(worktree, "checkout", "-q")
    admin = Path(git(repo, "rev-parse", "--absolute-git-dir")) / "worktrees" / "wt"
    entry = trash.remove_worktree(worktree, admin)
    trash.release()
    assert entry is not None and seen == {entry: 0}


def test_the_exiting_process_does_not_wait_on_a_shared_deleter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """However many names the top directory holds, they are given in one write the pipe
    takes whole (the rest is the final rm's): release() returns while each rm still
    sleeps, and the entry's lock is held meanwhile."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "rm").write_text("#!/bin/sh\nsleep 2\n")  # an rm that takes its time and deletes nothing
    (fake / "rm").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setattr(trash, "_SHARED_FROM", 10)
    monkeypatch.setattr(trash, "_SHARERS", 2)
    work = tmp_path / "work"
    for i in range(3000):  # more names, and longer, than a pipe holds
        (work / f"{i:04}-{'x' * 40}").mkdir(parents=True)
    entry = trash.discard(work, files=3000)
    assert entry is not None
    done = threading.Event()

    def release() -> None:
        trash.release()
        done.set()

    threading.Thread(target=release, daemon=True).start()
    assert done.wait(60), "release() waited on the deleter"
    assert trash.busy(entry)  # the rm processes hold the lock
    assert len(list(entry.iterdir())) == 3000  # (the stand-in deleted nothing)
    # The stand-in's remaining calls end at once (a new file: those running keep theirs),
    # so that no deleter outlives the test.
    quick = fake / "rm.quick"
    quick.write_text("#!/bin/sh\nexit 0\n")
    quick.chmod(0o755)
    os.replace(quick, fake / "rm")
    wait_until(lambda: not trash.busy(entry), "the stand-in deleter to finish")
