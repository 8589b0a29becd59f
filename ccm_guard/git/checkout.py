"""Work trees: linked worktrees (add, list, remove, prune), bringing a checkout to a
commit (read-tree, reset, restore, sparse checkout), and what is in one (status, ignored
and untracked files), including the pool's work trees that have only a private index.

`git status --porcelain=v2` is parsed here and nowhere else (`_parse_status`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Mapping, NamedTuple, Sequence

from ccm_guard.errors import GitError
from ccm_guard.git.core import Repo, describe_failure, run
from ccm_guard.git.index import trust_unchanged
from ccm_guard.git.objects import blob_at

# --- linked worktrees --------------------------------------------------------------------------


def worktree_add(repo: Repo, path: Path, branch: str, base: str) -> None:
    run(["worktree", "add", "--quiet", "-b", branch, str(path), base], repo, cwd="/")


def worktree_add_bare(repo: Repo, path: Path, branch: str, base: str) -> None:
    """`worktree add -b` without the checkout: the admin dir, HEAD and branch only (~10 ms
    at any size); `reset_hard` or a sparse setup fills the work tree afterwards."""
    run(["worktree", "add", "--quiet", "--no-checkout", "-b", branch, str(path), base], repo, cwd="/")


def worktree_remove(repo: Repo, path: Path) -> None:
    # Twice --force: also removes a worktree that is locked or has modifications.
    run(["worktree", "remove", "--force", "--force", str(path)], repo, cwd="/")


def worktree_prune(repo: Repo) -> None:
    run(["worktree", "prune"], repo, cwd="/")


def worktree_unlock(repo: Repo, path: Path) -> None:
    run(["worktree", "unlock", str(path)], repo, cwd="/")


class WorktreeEntry(NamedTuple):
    path: Path
    head: str | None
    branch: str | None  # full ref name, None when detached
    locked: str | None  # the lock reason ("" when locked without one)
    prunable: bool


def worktree_list(repo: Repo) -> list[WorktreeEntry]:
    entries: list[WorktreeEntry] = []
    for block in run(["worktree", "list", "--porcelain", "-z"], repo, cwd="/").out.split("\0\0"):
        fields: dict[str, str] = {}
        for line in block.split("\0"):
            key, _, value = line.partition(" ")
            if key:
                fields[key] = value
        if "worktree" in fields and "bare" not in fields:
            entries.append(WorktreeEntry(Path(fields["worktree"]), fields.get("HEAD"), fields.get("branch"),
                                         fields.get("locked"), "prunable" in fields))
    return entries


# --- bringing a checkout to a commit -----------------------------------------------------------


def fast_forward_checkout(repo: Repo, old: str, new: str) -> None:
    """Bring a clean checkout at `old` to `new`: index and changed files only (two-tree merge)."""
    run(["read-tree", "-m", "-u", old, new], repo)


def reset_hard(repo: Repo, rev: str = "HEAD") -> None:
    """Index and work tree to `rev`; files whose stat data match are not rewritten, and a
    sparse checkout's patterns are honoured. (`worktree add` itself runs exactly this.)"""
    run(["reset", "--quiet", "--hard", "--no-recurse-submodules", rev, "--"], repo)


def restore_paths(repo: Repo, rev: str, paths: Sequence[str], *, work_tree: bool = True) -> None:
    """Paths in the index (and the work tree) as `rev` has them (absent where it has
    none), in one call."""
    if paths:
        where = ["--staged", "--worktree"] if work_tree else ["--staged"]
        run(["restore", "--source", rev, *where, "--pathspec-from-file=-", "--pathspec-file-nul"],
            repo, input="\0".join(paths).encode("utf-8", "surrogateescape") + b"\0")


def reset_work_tree(repo: Repo, head: str, work: str | None = None) -> None:
    """The work tree (and its branch) exactly at `head`, then `work`'s files on top as
    uncommitted changes: how an archive or a snapshot with uncommitted work comes back."""
    run(["reset", "--quiet", "--hard", head], repo)
    run(["clean", "-f", "-d", "--quiet"], repo)
    if work is not None and work != head:
        run(["read-tree", "-m", "-u", head, work], repo)
        run(["reset", "--quiet", head], repo)  # the index back to head: the files stay as work


def restore_path(repo: Repo, rev: str, path: str) -> bool:
    """One path in index and work tree back to `rev`; False if `rev` does not have it (removed)."""
    if blob_at(repo, rev, path) is not None:
        run(["restore", "--source", rev, "--staged", "--worktree", "--", path], repo)
        return True
    run(["rm", "--quiet", "--cached", "--ignore-unmatch", "--", path], repo)
    return False


def sparse_set_cone(repo: Repo, directories: Sequence[str]) -> None:
    """Cone-mode sparse checkout of `directories` (from stdin: no name is taken for an
    option). Writes `info/sparse-checkout` in the admin dir, `core.sparseCheckout*` in its
    `config.worktree`, and `extensions.worktreeConfig` in the shared config if unset."""
    data = "".join(f"{d}\n" for d in directories).encode("utf-8", "surrogateescape")
    run(["sparse-checkout", "set", "--cone", "--stdin"], repo, input=data, literal=False)


# --- what is in a work tree --------------------------------------------------------------------


class StatusEntry(NamedTuple):
    code: str  # "??" untracked, "!!" ignored, "UU"-style unmerged, else the XY pair
    path: str
    head_mode: str = "000000"  # the mode in HEAD (tracked entries only)
    head_blob: str = ""  # the object in HEAD (tracked entries only)


def status(repo: Repo, *, ignored: bool = False, untracked: bool = True) -> list[StatusEntry]:
    """`git status --porcelain=v2 -z` of the repo's work tree, every untracked file listed.

    With `ignored`, ignored paths come too ("!!"; a wholly ignored directory is one entry),
    from the same walk of the work tree. Without `untracked`, only tracked changes (no walk
    for new files, about half the cost).
    """
    return _status(repo, ignored=ignored, untracked=untracked)


def hidden_by_index_flags(repo: Repo) -> list[str]:
    """Tracked paths whose changes `git status` does not look at: flagged assume-unchanged
    (`update-index --assume-unchanged`), or skip-worktree while the file is there on disk
    (a sparse checkout's skipped files are absent; `--skip-worktree` on a present file
    hides its edits)."""
    return [path for path, _, _ in _flagged(repo)]


def _flagged(repo: Repo, env: Mapping[str, str] | None = None) -> list[tuple[str, bool, bool]]:
    """The index's entries that git status skips, in index order: (path, flagged
    assume-unchanged, flagged skip-worktree while the file is on disk)."""
    found = []
    for record in run(["ls-files", "-v", "-z"], repo, env=env).z():
        tag, _, path = record.partition(" ")
        skipped = tag in "Ss" and repo.work_tree is not None and os.path.lexists(os.path.join(repo.work_tree, path))
        if tag.islower() or skipped:
            found.append((path, tag.islower(), skipped))
    return found


def _status(repo: Repo, *, ignored: bool, untracked: bool, env: Mapping[str, str] | None = None) -> list[StatusEntry]:
    args = ["status", "--porcelain=v2", "-z", "--untracked-files=" + ("all" if untracked else "no"), "--no-renames",
            "--ignore-submodules=none"]
    if ignored:
        args.append("--ignored=matching")
    return _parse_status(run(args, repo, env=env).z())


def _parse_status(records: list[str]) -> list[StatusEntry]:
    """The entries of `status --porcelain=v2 -z --no-renames` output, split on NUL.

    "? path" and "! path" are untracked and ignored; "1 XY sub mH mI mW hH hI path" an
    ordinary change (mH, hH: its HEAD side); "u XY sub m1 m2 m3 mW h1 h2 h3 path" an
    unmerged one (m1, h1 taken as its HEAD side); "#" headers and "2" records (renames,
    switched off) are not asked for.
    """
    entries = []
    for record in records:
        kind = record[0]
        if kind in "?!":
            entries.append(StatusEntry(kind * 2, record[2:]))
        elif kind == "1":
            fields = record.split(" ", 8)
            entries.append(StatusEntry(fields[1], fields[8], fields[3], fields[6]))
        elif kind == "u":
            fields = record.split(" ", 10)
            entries.append(StatusEntry(fields[1], fields[10], fields[3], fields[7]))
    return entries


def ignored_untracked(repo: Repo) -> list[str]:
    """Untracked paths the repository's own ignore rules ignore, relative to the top.

    A directory git does not walk into (wholly ignored, `node_modules/`) is one entry
    ending in "/". Tracked files are never listed, ignored or not. (For .worktreeinclude.)
    """
    return run(["ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z"], repo).z()


def untracked_listed(repo: Repo, paths: Sequence[str]) -> list[str]:
    """The untracked files at or below `paths`, ignored ones too (no empty directory, no
    staged file): what a checkout holds of its own there."""
    return _listed(repo, "--others", paths)


def tracked_listed(repo: Repo, paths: Sequence[str]) -> list[str]:
    """The files of the index at or below `paths`."""
    return _listed(repo, "--cached", paths)


def _listed(repo: Repo, which: str, paths: Sequence[str]) -> list[str]:
    found: list[str] = []
    for start in range(0, len(paths), 1000):  # a command line holds only so many paths
        found += run(["ls-files", which, "-z", "--", *paths[start:start + 1000]], repo).z()
    return found


def untracked_matching(repo: Repo, patterns: Path) -> list[str]:
    """Untracked paths the gitignore-style patterns in the file `patterns` match, whatever
    the repository's own ignore rules say; a directory whose untracked files all match is
    one entry ending in "/". git does the matching, so its rules (anchoring, `**`,
    negation, directory-only patterns) hold exactly.
    """
    return run(["ls-files", "--others", "--ignored", f"--exclude-from={patterns}", "--directory", "-z"], repo).z()


class IgnoreRule(NamedTuple):
    source: str  # the ignore file, relative to the work tree when it is in it
    line: str
    pattern: str
    path: str


def check_ignore(repo: Repo, paths: list[str]) -> list[IgnoreRule]:
    """Which rule of which ignore file ignores each path."""
    if not paths:
        return []
    res = run(["check-ignore", "--verbose", "--no-index", "-z", "--stdin"], repo, literal=False,
              input="\0".join(paths).encode("utf-8", "surrogateescape") + b"\0", check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    fields = res.out.split("\0")
    return [IgnoreRule(*fields[i:i + 4]) for i in range(0, len(fields) - 3, 4) if fields[i]]


# --- pool work trees without an admin entry ----------------------------------------------------
# A pooled work tree is a directory and ccm-guard's own index file, with no entry under
# <common>/worktrees: nothing a running task's snapshot sees. Git is run on it as the
# common dir's work tree with a private index (GIT_INDEX_FILE); the main worktree's own
# config.worktree is read then, so its sparse settings are switched off for these calls.

def _config_env(*pairs: tuple[str, str]) -> dict[str, str]:
    """Config for one git call through the environment (GIT_CONFIG_COUNT/KEY_n/VALUE_n)."""
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for n, (key, value) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{n}"], env[f"GIT_CONFIG_VALUE_{n}"] = key, value
    return env


# A private index is whole: a split one would link to a shared index in the git dir,
# which the agent can write (core.splitIndex).
_PRIVATE_INDEX = (("core.sparseCheckout", "false"), ("index.sparse", "false"), ("core.splitIndex", "false"))
_PRIVATE_INDEX_CONFIG = _config_env(*_PRIVATE_INDEX)


def checkout_with_index(repo: Repo, index: Path, rev: str) -> None:
    """Write `rev`'s files into repo.work_tree, recording them in the index file `index`
    (made if missing). No ref, HEAD or other index is touched."""
    run(["read-tree", "--reset", "-u", rev], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG})


def refresh_index(repo: Repo) -> None:
    """Refresh a checkout's own index: files whose stat data alone changed read as clean again."""
    run(["update-index", "-q", "--refresh"], repo, check=False)


def refresh_with_index(repo: Repo, index: Path) -> None:
    run(["update-index", "-q", "--refresh"], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG},
        check=False)


def status_with_index(repo: Repo, index: Path) -> list[StatusEntry]:
    """`status` of repo.work_tree against the index file `index`, ignored files included.
    (Its index-against-HEAD half compares with the common dir's HEAD: callers look only at
    the work tree side.)"""
    return _status(repo, ignored=True, untracked=True, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG})


def files_match_index(repo: Repo, index: Path) -> bool:
    """Whether every file of the index file `index` is in repo.work_tree exactly as recorded
    (its stat data, else its content): `diff-files`, which lists no directory, so an
    untracked file goes unseen (the caller proves there is none another way)."""
    env = {"GIT_INDEX_FILE": str(index), **_config_env(*_PRIVATE_INDEX, *_STAT_RULES)}
    return run(["diff-files", "--quiet", "--ignore-submodules=none"], repo, env=env, check=False).returncode == 0


# Stat data decides which files git reads: no config may loosen how it is compared. (A
# sparse task's own settings stay: its skipped files are absent, not deleted, and one
# written outside the cone is seen as git sees it in the task.)
_STAT_RULES = (("core.trustCtime", "true"), ("core.checkStat", "default"), ("core.ignoreStat", "false"),
               ("core.splitIndex", "false"))
_STAT_CHECKED = _config_env(*_STAT_RULES)


def unsplit_index(repo: Repo, index: Path) -> None:
    """Rewrite the index file `index` whole, where it links to a shared index in the git
    dir (core.splitIndex): a copy that must mean the same later cannot depend on a file
    the agent can rewrite."""
    run(["update-index", "--no-split-index"], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG})


class KeptIndex(NamedTuple):
    """ccm-guard's copy of a task's index file, the commit it was taken at, whether it is
    the index of ccm-guard's own checkout (no setup step ran: nothing staged or flagged),
    and when the copy was made (its change time, ns: before the agent started; 0 unknown)."""

    path: Path
    at: str
    pristine: bool = False
    made_ns: int = 0


def status_without_trusting_index(repo: Repo, trusted: KeptIndex | None, *, ignored: bool,
                                  head: str | None = None,
                                  absent_by_design: Callable[[str], bool] | None = None,
                                  index_untouched: bool = False) -> list[StatusEntry]:
    """`status` of the work tree against HEAD, where the index the agent wrote decides nothing
    about which files git reads: git skips a file whose stat data matches its index entry,
    and an agent can write an entry that pairs HEAD's blob with its edited file's stat data.

    `trusted` is ccm-guard's copy of the index taken before the agent (None: none to be had).
    A private copy of it is brought to HEAD by a one-tree merge: entries the commits
    changed lose their stat data, so git reads those files, and any other file the run
    wrote has a new change time, which no one can set back, so git reads it too. Without
    one (or where the merge fails) the private index is HEAD's tree without stat data:
    every file is read. What the agent's index stages on top of HEAD is listed as well.
    `head`: the task branch's tip, where known. `absent_by_design`: the paths a sparse
    task does not check out (their absence is no deletion). `index_untouched`: the agent's
    index holds the same bytes as when `trusted` was copied from it; a pristine one at
    `head` then stages nothing (no git process asks)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ccm-guard-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp, "index")), **_STAT_CHECKED}
        private_index(repo, trusted, env, head=head)
        entries = _status(repo, ignored=ignored, untracked=True, env=env)
    if absent_by_design is not None:
        entries = [e for e in entries if not (e.code == ".D" and absent_by_design(e.path))]
    listed = {e.path for e in entries}
    if index_untouched and trusted is not None and trusted.pristine and head == trusted.at:
        return entries
    for change in staged_changes(repo):
        if change.path not in listed:
            entries.append(change)
    return entries


def private_index(repo: Repo, trusted: KeptIndex | None, env: Mapping[str, str], *, head: str | None = None) -> bool:
    """Make env's GIT_INDEX_FILE hold HEAD: from `trusted` where it can, keeping its stat
    data for the entries whose object and mode HEAD has too (True); else HEAD's tree alone.
    A pristine copy taken where HEAD still is serves as it is (no git process)."""
    import shutil

    private = Path(env["GIT_INDEX_FILE"])
    if trusted is not None:
        try:
            shutil.copy2(trusted.path, private)  # with its mtime: entries as new as the index stay untrusted
        except OSError:
            trusted = None  # gone meanwhile: every file is read
    if trusted is not None:
        trusted_as_of = None
        if trusted.pristine and repo.work_tree is not None:
            # ccm-guard's own checkout, copied before anyone could write into it: its racily
            # clean entries (a fresh checkout's every file) are not all read again where proven.
            trusted_as_of = trust_unchanged(private, repo.work_tree, written_before_ns=trusted.made_ns,
                                            oid_len=len(trusted.at) // 2)
        if trusted.pristine and head == trusted.at:
            return True
        # A one-tree merge keeps the stat data of the entries HEAD matches; -i: the work
        # tree is not asked (it is what is being judged).
        if run(["read-tree", "-m", "-i", "HEAD"], repo, env=env, check=False).returncode == 0:
            if not trusted.pristine:
                _unflag(repo, env)
            elif trusted_as_of is not None:  # rewritten now: its kept entries are the proven ones
                os.utime(private, ns=(trusted_as_of, trusted_as_of))
            return True
        private.unlink(missing_ok=True)
    run(["read-tree", "HEAD"], repo, env=env)
    return False


def _unflag(repo: Repo, env: Mapping[str, str]) -> None:
    """Take off the private index the flags that make git skip a file: what a setup step
    marked assume-unchanged, or skip-worktree while the file is on disk (ccm-guard's own
    checkout has neither, but for a sparse task's absent files)."""
    flagged = _flagged(repo, env)
    valid = [path for path, assumed, _ in flagged if assumed]
    skipped = [path for path, _, present in flagged if present]
    for flag, paths in (("--no-assume-unchanged", valid), ("--no-skip-worktree", skipped)):
        if paths:
            run(["update-index", flag, "-z", "--stdin"], repo, env=env,
                input="\0".join(paths).encode("utf-8", "surrogateescape") + b"\0")


def staged_changes(repo: Repo) -> list[StatusEntry]:
    """What the repo's own index holds that HEAD does not (its X side only: "M." and the like)."""
    out = run(["diff-index", "--cached", "-z", "--raw", "--no-renames", "--ignore-submodules=none", "HEAD", "--"],
              repo).z()
    changes = []
    for meta, path in zip(out[0::2], out[1::2]):
        head_mode, _, head_blob, _, letter = meta.lstrip(":").split(" ")
        changes.append(StatusEntry(f"{letter[0]}.", path, head_mode, head_blob))
    return changes


def clean_with_index(repo: Repo, index: Path) -> None:
    """`git clean -ffdx` for a work tree whose index is the file `index`."""
    run(["clean", "-ffdxq"], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG})
