"""The blocked-commit signature: real git failures, and lines an agent could print instead.

The first tests make git 2.39 fail for real under each kind of sandbox (Landlock: EACCES;
an immutable directory: EPERM, what macOS Seatbelt reports; a read-only bind mount:
EROFS, what bubblewrap reports). The table below holds the lines they produced, with
the paths replaced by placeholders, and the near misses that must not match.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import git, make_repo
from test_sandbox import confined, needs_landlock

from ccm_guard.detect import signatures
from ccm_guard.prevent import roots


def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(linked worktree, its admin dir, common dir); a space in the path on purpose."""
    main = make_repo(tmp_path / "my repo")
    wt = tmp_path / "my wt"
    git(main, "worktree", "add", "-q", "-b", "ccm/t1", str(wt))
    git(main, "worktree", "add", "-q", "-b", "ccm/other", str(tmp_path / "other"))
    # git names the admin dir after the worktree, sanitised ("my wt" -> "my-wt").
    admin = Path((wt / ".git").read_text().removeprefix("gitdir: ").strip())
    assert admin.parent == main / ".git" / "worktrees"
    return wt, admin, main / ".git"


def find(text: str, admin: Path, common: Path) -> signatures.Signature | None:
    return signatures.find_blocked_commit(text, [admin, common])


# --- real failures, produced here -------------------------------------------------------


@needs_landlock
@pytest.mark.parametrize("granted, script, level, lock", [
    # What every sandbox that ignores linked worktrees does: the index lock.
    (1, "echo x >> README.md; git add README.md; git commit -qam work", "fatal", "worktrees/my-wt/index.lock"),
    # Admin dir and objects writable, not the refs: the branch's lock, behind git's context.
    (3, "echo x >> README.md && git add README.md && git commit -qm work", "fatal", "refs/heads/ccm/t1.lock"),
    (1, "git update-ref refs/heads/ccm/t1 HEAD", "fatal", "refs/heads/ccm/t1.lock"),
    # The sequencer reports with error: before its own fatal.
    (1, "git cherry-pick ccm/other", "error", "worktrees/my-wt/index.lock"),
])
def test_real_landlock_denials_match(tmp_path: Path, granted: int, script: str, level: str, lock: str) -> None:
    wt, admin, common = setup(tmp_path)
    git(tmp_path / "other", "commit", "-q", "--allow-empty", "-m", "to pick")
    proc = confined(roots.writable_roots(wt)[:granted], script, wt)
    assert proc.returncode != 0
    found = find(proc.stderr, admin, common)
    assert found is not None, proc.stderr
    assert found.lock == common.resolve() / lock
    assert found.reason == "Permission denied"
    assert found.line.startswith(f"{level}: ") and found.line in proc.stderr.splitlines()


@needs_landlock
@pytest.mark.parametrize("granted, words", [(2, "insufficient permission"), (4, "unable to append to")])
def test_real_denials_that_are_not_a_lock_do_not_match(tmp_path: Path, granted: int, words: str) -> None:
    # Objects, or the reflog: the commit fails, but no lock file was refused.
    wt, admin, common = setup(tmp_path)
    proc = confined(roots.writable_roots(wt)[:granted], "echo x >> README.md && git add -A && git commit -qm w", wt)
    assert proc.returncode != 0 and words in proc.stderr
    assert find(proc.stderr, admin, common) is None


def test_real_immutable_admin_dir_gives_operation_not_permitted(tmp_path: Path) -> None:
    wt, admin, common = setup(tmp_path)
    if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(admin)], capture_output=True).returncode:
        pytest.skip("chattr +i needs CAP_LINUX_IMMUTABLE and a filesystem that supports it")
    try:
        proc = subprocess.run(["git", "commit", "-qam", "work"], cwd=wt, capture_output=True, text=True)
    finally:
        subprocess.run(["chattr", "-i", str(admin)], check=True)
    found = find(proc.stderr, admin, common)
    assert found is not None, proc.stderr
    assert (found.reason, found.lock.name) == ("Operation not permitted", "index.lock")


def test_real_read_only_mount_gives_read_only_file_system(tmp_path: Path) -> None:
    wt, admin, common = setup(tmp_path)
    (wt / "README.md").write_text("changed\n")
    # A private mount namespace in a user namespace: needs no privilege where allowed.
    script = ('mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" || exit 99; '
              "git commit -qam work")
    proc = subprocess.run(["unshare", "-r", "-m", "sh", "-c", script, str(admin)], cwd=wt,
                          capture_output=True, text=True)
    if proc.returncode == 99 or "unshare failed" in proc.stderr or "unshare:" in proc.stderr:
        pytest.skip(f"no user and mount namespaces here: {proc.stderr.strip()}")
    found = find(proc.stderr, admin, common)
    assert found is not None, proc.stderr
    assert (found.reason, found.lock.name) == ("Read-only file system", "index.lock")


# --- the table ---------------------------------------------------------------------------

# Lines git 2.39 printed in the tests above (and by hand for pack-refs and merge).
REAL = [
    "fatal: Unable to create '{admin}/index.lock': Permission denied",
    "fatal: Unable to create '{admin}/index.lock': Operation not permitted",
    "fatal: Unable to create '{admin}/index.lock': Read-only file system",
    "fatal: cannot lock ref 'HEAD': Unable to create '{common}/refs/heads/ccm/t1.lock': Permission denied",
    "fatal: update_ref failed for ref 'refs/heads/ccm/t1': cannot lock ref 'refs/heads/ccm/t1': "
    "Unable to create '{common}/refs/heads/ccm/t1.lock': Permission denied",
    "fatal: update_ref failed for ref 'ORIG_HEAD': cannot lock ref 'ORIG_HEAD': "
    "Unable to create '{admin}/ORIG_HEAD.lock': Permission denied",
    "error: Unable to create '{admin}/index.lock': Permission denied",
    "fatal: Unable to create '{common}/packed-refs.lock': Permission denied",
]

# How the same line arrives through a pty, a pipe or another program's wrapper.
DRESSED = [
    "\x1b[31mfatal: Unable to create '{admin}/index.lock': Permission denied\x1b[m",
    "\x1b]0;title\x07\x1b[1;31mfatal:\x1b[0m Unable to create '{admin}/index.lock': Permission denied",
    "fatal: Unable to create '{admin}/index.lock': Permission denied\r\n",
    "Counting objects: 100% (3/3)\rfatal: Unable to create '{admin}/index.lock': Permission denied",
    "running tests\nall passed\n\nfatal: Unable to create '{admin}/index.lock': Permission denied\nmore\n",
    "   fatal: Unable to create '{admin}/index.lock': Permission denied  ",
    "fatal: Unable to create {admin}/index.lock: Operation not permitted",  # unquoted, space in path
]

NOT_THIS = [
    # Real git lines, but not a lock that a sandbox refused.
    "fatal: cannot update the ref 'refs/heads/ccm/t1': unable to append to "
    "'{common}/logs/refs/heads/ccm/t1': Permission denied",
    "error: insufficient permission for adding an object to repository database {common}/objects",
    "error: could not lock config file {common}/config: Permission denied",
    "fatal: Unable to create '{admin}/index.lock': File exists.",
    "fatal: Unable to create '{admin}/index.lock': No space left on device",
    # Spoofs and near misses.
    "Unable to create '{admin}/index.lock': Permission denied",
    "summary: fatal: Unable to create '{admin}/index.lock': Permission denied",
    "remote: fatal: Unable to create '{admin}/index.lock': Permission denied",
    "warning: Unable to create '{admin}/index.lock': Permission denied",
    "fatal:Unable to create '{admin}/index.lock': Permission denied",
    "fatal: Unable to create '{admin}/index.lock.bak': Permission denied",
    "fatal: Unable to create '{admin}/index.lock/x': Permission denied",
    "fatal: Unable to create {admin}/index.lock.bak: Permission denied",
    "fatal: Unable to create '{admin}/index.lock': Permission denied (just kidding)",
    "fatal: Unable to create '{admin}/index': Permission denied",
    "fatal: Unable to create '.git/worktrees/my-wt/index.lock': Operation not permitted",  # relative
    "fatal: Unable to create '/elsewhere/.git/worktrees/my-wt/index.lock': Permission denied",
    "fatal: Unable to create '{common}/worktrees/other/index.lock': Permission denied",
    "fatal: Unable to create '{admin}/../other/index.lock': Permission denied",
    "fatal: Unable to create '{common}/index.lock': Permission denied",  # the main checkout's index
    "fatal: Unable to create '{common}/HEAD.lock': Permission denied",
]


@pytest.mark.parametrize("line", REAL + DRESSED)
def test_table_matches(tmp_path: Path, line: str) -> None:
    wt, admin, common = setup(tmp_path)
    found = find(line.format(admin=admin, common=common), admin, common)
    assert found is not None
    assert found.reason in signatures.REASONS
    assert found.lock.name.endswith(".lock") and "\x1b" not in found.line and "\r" not in found.line


@pytest.mark.parametrize("line", NOT_THIS)
def test_table_does_not_match(tmp_path: Path, line: str) -> None:
    wt, admin, common = setup(tmp_path)
    assert find(line.format(admin=admin, common=common), admin, common) is None


def test_result_names_the_line_the_lock_and_the_reason(tmp_path: Path) -> None:
    wt, admin, common = setup(tmp_path)
    text = f"noise\n\x1b[31mfatal: Unable to create '{admin}/index.lock': Read-only file system\x1b[m\r\n"
    assert find(text, admin, common) == signatures.Signature(
        line=f"fatal: Unable to create '{admin}/index.lock': Read-only file system",
        lock=admin.resolve() / "index.lock", reason="Read-only file system",
    )


def test_paths_are_compared_as_real_paths(tmp_path: Path) -> None:
    wt, admin, common = setup(tmp_path)
    (tmp_path / "alias").symlink_to(common.parent)
    via_link = tmp_path / "alias" / ".git"
    line = f"fatal: Unable to create '{via_link}/worktrees/my-wt/index.lock': Permission denied"
    assert find(line, admin, common) is not None
    real = f"fatal: Unable to create '{admin}/index.lock': Permission denied"
    assert signatures.find_blocked_commit(real, [via_link / "worktrees" / "my-wt", via_link]) is not None


def test_main_worktree_task_owns_its_index_lock(tmp_path: Path) -> None:
    main = make_repo(tmp_path / "repo")
    line = f"fatal: Unable to create '{main}/.git/index.lock': Permission denied"
    assert signatures.find_blocked_commit(line, [main / ".git"]) is not None
    assert signatures.find_blocked_commit(line, [tmp_path / "elsewhere"]) is None


def test_first_matching_line_wins(tmp_path: Path) -> None:
    wt, admin, common = setup(tmp_path)
    text = (f"fatal: Unable to create '/elsewhere/index.lock': Permission denied\n"
            f"error: Unable to create '{admin}/index.lock': Permission denied\n"
            f"fatal: Unable to create '{common}/refs/heads/ccm/t1.lock': Operation not permitted\n")
    found = find(text, admin, common)
    assert found is not None and found.lock.name == "index.lock"


def test_empty_and_unrelated_text(tmp_path: Path) -> None:
    wt, admin, common = setup(tmp_path)
    assert find("", admin, common) is None
    assert find("[main 1234567] work\n 1 file changed\n", admin, common) is None
    assert os.path.exists(admin)
