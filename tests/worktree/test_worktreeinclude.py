"""`.worktreeinclude`: ignored files of the person's checkout copied into a new worktree.

Real repositories and a real `git worktree add`; the copies are checked on disk and
against what git itself says about them in the new worktree.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
from pathlib import Path

from conftest import git, make_repo, run_exec, write_agent

from ccm_guard import clone
from ccm_guard.worktree.include import copy_included

GITIGNORE = "node_modules/\n.env\nbuild/\n*.log\ncache\nvendor\n"


def checkout(tmp_path: Path, include: str | None, gitignore: str = GITIGNORE) -> Path:
    files = {".gitignore": gitignore, "README.md": "# project\n", "src/app.py": "print('hi')\n"}
    if include is not None:
        files[".worktreeinclude"] = include
    return make_repo(tmp_path / "repo", files)


def new_worktree(repo: Path, name: str = "wt", base: str = "HEAD") -> Path:
    path = repo.parent / name
    git(repo, "worktree", "add", "-q", "-b", f"task-{name}", str(path), base)
    return path


def tracked_then_ignored(repo: Path, path: str, pattern: str) -> str:
    """Commit `path` as tracked, then untrack it (gone from disk too) and ignore `pattern`
    in a later commit; returns the first commit, a task base that still tracks `path`."""
    git(repo, "add", path)
    git(repo, "commit", "-q", "-m", f"track {path}")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "rm", "-q", path)
    write(repo / ".gitignore", f"{pattern}\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", f"ignore {pattern}")
    return base


def write(path: Path, text: str, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mode is not None:
        path.chmod(mode)
    return path


def ignored_in(worktree: Path) -> set[str]:
    """What git, in the new worktree, reports as ignored (clean-tree does not count these)."""
    out = git(worktree, "status", "--porcelain", "--ignored", "--untracked-files=all")
    return {line[3:] for line in out.splitlines() if line.startswith("!! ")}


def untracked_in(worktree: Path) -> set[str]:
    out = git(worktree, "status", "--porcelain", "--ignored", "--untracked-files=all")
    return {line[3:] for line in out.splitlines() if line.startswith("?? ")}


def test_only_ignored_files_the_patterns_name_are_copied(tmp_path: Path) -> None:
    repo = checkout(tmp_path, ".env\nnode_modules/\nbuild/config.json\nREADME.md\n*.env\n")
    write(repo / ".env", "SECRET=1\n", 0o600)
    write(repo / "node_modules/pkg/index.js", "module.exports = 1\n")
    write(repo / "node_modules/pkg/cli.js", "#!/usr/bin/env node\n", 0o755)
    write(repo / "build/config.json", "{}\n")
    write(repo / "build/out.o", "object\n")  # ignored, but no pattern names it
    write(repo / "local.env", "not ignored\n")  # matches *.env, but git does not ignore it
    write(repo / "notes.log", "ignored, not named\n")
    wt = new_worktree(repo)

    result = copy_included(repo, wt)

    assert sorted(i.path for i in result.included) == [".env", "build/config.json", "node_modules/"]
    assert (wt / ".env").read_text() == "SECRET=1\n"
    assert (wt / "node_modules/pkg/index.js").read_text() == "module.exports = 1\n"
    assert (wt / "build/config.json").read_text() == "{}\n"
    for absent in ("build/out.o", "local.env", "notes.log"):
        assert not (wt / absent).exists(), absent
    # README.md is tracked: named by a pattern, never copied (the worktree's own is git's).
    assert (wt / "README.md").read_text() == "# project\n"
    assert result.files == 4 and result.bytes == sum(
        len(t) for t in ("SECRET=1\n", "module.exports = 1\n", "#!/usr/bin/env node\n", "{}\n"))
    assert sum(result.by_how.values()) == 4 and set(result.by_how) <= {"reflink", "copy"}
    # What was copied is ignored in the new worktree too: clean-tree and path-policy skip it.
    assert ignored_in(wt) == {".env", "build/config.json", "node_modules/pkg/index.js", "node_modules/pkg/cli.js"}
    assert untracked_in(wt) == set()


def test_modes_times_and_symlinks_are_kept_and_links_not_followed(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "secret.txt", "outside the checkout\n")
    repo = checkout(tmp_path, "node_modules/\ncache\n.env\n")
    tool = write(repo / "node_modules/.bin/tool", "#!/bin/sh\n", 0o751)
    os.utime(tool, ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    os.symlink("../pkg/index.js", repo / "node_modules/.bin/rel-link")
    os.symlink(outside.parent, repo / "cache")  # an ignored symlink to a directory outside
    wt = new_worktree(repo)

    result = copy_included(repo, wt)

    copied = wt / "node_modules/.bin/tool"
    assert stat.S_IMODE(copied.stat().st_mode) == 0o751
    assert copied.stat().st_mtime_ns == 1_600_000_000_123_456_789
    assert os.readlink(wt / "node_modules/.bin/rel-link") == "../pkg/index.js"
    assert os.readlink(wt / "cache") == str(outside.parent)  # the link itself, not its target's files
    assert {i.path: (i.how, i.files, i.bytes) for i in result.included}["cache"] == ("symlink", 1, 0)
    assert outside.read_text() == "outside the checkout\n"
    assert result.by_how["symlink"] == 2


def test_no_worktreeinclude_copies_nothing(tmp_path: Path) -> None:
    repo = checkout(tmp_path, None)
    write(repo / ".env", "SECRET=1\n")
    wt = new_worktree(repo)

    result = copy_included(repo, wt)

    assert result.source is None and result.included == [] and result.files == 0
    assert not (wt / ".env").exists()


def test_a_worktreeinclude_that_is_a_symlink_is_not_followed(tmp_path: Path) -> None:
    elsewhere = write(tmp_path / "patterns", ".env\n")
    repo = checkout(tmp_path, None, GITIGNORE + ".worktreeinclude\n")
    os.symlink(elsewhere, repo / ".worktreeinclude")
    write(repo / ".env", "SECRET=1\n")
    wt = new_worktree(repo)

    assert copy_included(repo, wt).source is None
    assert not (wt / ".env").exists()


def test_nested_git_directories_are_never_copied(tmp_path: Path) -> None:
    repo = checkout(tmp_path, "node_modules/\n")
    write(repo / "node_modules/dep/index.js", "1\n")
    write(repo / "node_modules/dep/.git/config", "[core]\n\thooksPath = /tmp/evil\n")
    wt = new_worktree(repo)

    copy_included(repo, wt)

    assert (wt / "node_modules/dep/index.js").exists()
    assert not (wt / "node_modules/dep/.git").exists()


def test_a_path_the_new_worktree_has_is_not_overwritten_and_its_directory_is_filled_in(tmp_path: Path) -> None:
    # At the task's base, build/config.json was tracked; in the checkout it is now ignored.
    repo = checkout(tmp_path, "build/\n", "")
    write(repo / "build/config.json", "tracked at the base\n")
    base = tracked_then_ignored(repo, "build/config.json", "build/")
    write(repo / "build/config.json", "the person's local one\n")
    write(repo / "build/cache/index.bin", "cache\n")
    wt = new_worktree(repo, base=base)

    result = copy_included(repo, wt)

    assert (wt / "build/config.json").read_text() == "tracked at the base\n"
    # The rest of the directory the worktree already has is filled in.
    assert (wt / "build/cache/index.bin").read_text() == "cache\n"
    assert [i.path for i in result.included] == ["build/cache/"]
    assert [p for p, _ in result.skipped] == ["build/config.json"]
    assert "already has this path" in result.skipped[0][1]


def test_nothing_is_written_through_a_symlink_in_the_new_worktree(tmp_path: Path) -> None:
    # At the base, `conf` is a tracked symlink out of the worktree; in the checkout it is
    # an ignored directory now. Copying conf/local.json must not write through the link.
    target = tmp_path / "victim"
    target.mkdir()
    repo = checkout(tmp_path, "conf/local.json\n", "")
    os.symlink(target, repo / "conf")
    base = tracked_then_ignored(repo, "conf", "conf/")
    write(repo / "conf/local.json", "{}\n")
    write(repo / "conf/other.txt", "ignored, not named\n")
    wt = new_worktree(repo, base=base)

    result = copy_included(repo, wt)

    assert list(target.iterdir()) == []
    assert result.included == [] and [p for p, _ in result.skipped] == ["conf/local.json"]
    assert "symlink or file in the new worktree" in result.skipped[0][1]


def test_files_inside_an_ignored_directory_are_picked_one_by_one(tmp_path: Path) -> None:
    repo = checkout(tmp_path, "*.env\n!dev.env\nbuild/**/settings.json\n")
    write(repo / "build/a/settings.json", "a\n")
    write(repo / "build/a/other.json", "other\n")
    write(repo / "build/prod.env", "prod\n")
    write(repo / "build/dev.env", "dev\n")  # negated in .worktreeinclude
    write(repo / ".env", "top\n")
    wt = new_worktree(repo)

    result = copy_included(repo, wt)

    assert sorted(i.path for i in result.included) == [".env", "build/a/settings.json", "build/prod.env"]
    assert not (wt / "build/dev.env").exists() and not (wt / "build/a/other.json").exists()


def test_names_with_spaces_newlines_and_odd_bytes(tmp_path: Path) -> None:
    repo = checkout(tmp_path, "local/\n", "local/\n")
    odd = os.fsencode(str(repo / "local")) + b"/caf\xe9 \nname.txt"
    (repo / "local").mkdir()
    with open(odd, "wb") as fh:
        fh.write(b"odd\n")
    wt = new_worktree(repo)

    result = copy_included(repo, wt)

    assert result.files == 1
    with open(os.fsencode(str(wt / "local")) + b"/caf\xe9 \nname.txt", "rb") as fh:
        assert fh.read() == b"odd\n"


def test_link_dirs_links_a_directory_git_still_ignores_as_a_link(tmp_path: Path) -> None:
    # `vendor` (no trailing slash) ignores a symlink named vendor too.
    repo = checkout(tmp_path, "vendor\n")
    write(repo / "vendor/lib/big.bin", "x" * 1000)
    wt = new_worktree(repo)

    result = copy_included(repo, wt, link_dirs=True)

    assert (wt / "vendor").is_symlink() and os.readlink(wt / "vendor") == str(repo / "vendor")
    assert [(i.path, i.how) for i in result.included] == [("vendor/", "link")]
    assert result.by_how == {"link": 1} and result.files == 0 and result.warnings == []
    assert "vendor" in ignored_in(wt) and untracked_in(wt) == set()


def test_link_dirs_copies_a_directory_whose_rule_would_not_ignore_the_link(tmp_path: Path) -> None:
    # `node_modules/` matches directories only: git would see a link as an untracked file
    # (the clean-tree and path-policy gates would fail every run), so it is copied instead.
    repo = checkout(tmp_path, "node_modules/\n")
    write(repo / "node_modules/pkg/index.js", "1\n")
    wt = new_worktree(repo)

    result = copy_included(repo, wt, link_dirs=True)

    assert not (wt / "node_modules").is_symlink()
    assert (wt / "node_modules/pkg/index.js").read_text() == "1\n"
    assert [i.how for i in result.included] != ["link"] and "link" not in result.by_how
    assert len(result.warnings) == 1 and "without a trailing slash" in result.warnings[0]
    assert untracked_in(wt) == set()


def _reflinks_in(directory: Path) -> bool:
    a, b = directory / ".probe-a", directory / ".probe-b"
    a.write_bytes(b"x" * 4096)
    try:
        with open(a, "rb") as src, open(b, "wb") as dst:
            fcntl.ioctl(dst.fileno(), clone.FICLONE, src.fileno())
        return True
    except OSError as exc:
        assert exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL), exc
        return False
    finally:
        a.unlink()
        b.unlink(missing_ok=True)


def test_copies_are_reflinks_where_the_file_system_has_them(tmp_path: Path) -> None:
    """On btrfs or XFS (set CCM_GUARD_REFLINK_DIR to a directory on one), files are reflinked;
    elsewhere they are plain copies. Either way the content is the same."""
    where = Path(os.environ.get("CCM_GUARD_REFLINK_DIR") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    root = Path(os.path.realpath(where)) / f"reflink-{os.getpid()}-{tmp_path.name}"
    root.mkdir()
    try:
        expected = "reflink" if _reflinks_in(root) else "copy"
        repo = checkout(root, "blobs/\n", "blobs/\n")
        data = os.urandom(1 << 20)
        (repo / "blobs").mkdir()
        (repo / "blobs/data.bin").write_bytes(data)
        wt = new_worktree(repo)

        result = copy_included(repo, wt)

        assert result.by_how == {expected: 1}
        assert (wt / "blobs/data.bin").read_bytes() == data
        if "CCM_GUARD_REFLINK_DIR" in os.environ:
            assert expected == "reflink", "CCM_GUARD_REFLINK_DIR is not on a file system with reflinks"
    finally:
        shutil.rmtree(root)


def test_exec_brings_the_included_ignored_files_and_still_passes(tmp_path: Path) -> None:
    from conftest import run_exec, write_agent

    repo = make_repo(tmp_path / "repo", {"README.md": "x\n", ".gitignore": ".env\nnode_modules/\n",
                                         ".worktreeinclude": ".env\n"})
    (repo / ".env").write_text("TOKEN=1\n")
    (repo / "node_modules").mkdir()
    (repo / "node_modules" / "big.js").write_text("x\n")
    agent = write_agent(tmp_path, 'test "$(cat .env)" = TOKEN=1\ntest ! -e node_modules\n'
                        'echo y > y.txt\nrgit add y.txt\nrgit commit -q -m y\n')
    result = run_exec(repo, agent)
    assert result.code == 0, result.stderr + str(result.verdict["gates"])
    assert any("brought 1 ignored file(s)" in note for note in result.verdict["notes"])


def test_a_fifo_named_worktreeinclude_does_not_block_exec(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    os.mkfifo(repo / ".worktreeinclude")  # opening it for reading would wait for a writer for ever
    res = run_exec(repo, write_agent(tmp_path, "true"), "--sandbox", "none", "--no-require-commit", timeout=30)
    assert res.code == 0, res.verdict
