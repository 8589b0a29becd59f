"""The one gateway to the git binary.

Every git process ccm-guard starts is built here, hardened against what an agent
may have planted in the repository (DESIGN.md § Detection):

- the git dir, common dir and work tree are passed explicitly from paths pinned when
  the task was created, so a rewritten `.git` pointer, `commondir` or `core.worktree`
  cannot redirect ccm-guard to a decoy;
- hooks, fsmonitor, pagers, replace objects, grafts, the commit-graph, signing and
  auto-gc are off; the global and system config and the person's HOME are not read
  (the agent can write `$HOME/.gitconfig` when it runs unsandboxed);
- optional locks are off, so reading status never rewrites an index;
- output is `-z` and split on NUL.

Subprocess rather than plumbum: plumbum costs ~66 ms at import here (PERF-NOTES), a
third of the budget of a whole `exec` on a small repository; this module is the only
place that would change if that ever flips.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ccm_guard.errors import GitError, NotARepository, RepoError, UntrustedRepoError

HARDENING = (
    "--no-pager",
    "--no-replace-objects",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.commitGraph=false",
    "-c", "core.pager=cat",
    "-c", "core.editor=false",
    "-c", "sequence.editor=false",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "log.showSignature=false",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "submodule.recurse=false",
    "-c", "core.askPass=",
    "-c", "credential.helper=",
    "-c", "advice.graftFileDeprecated=false",  # GIT_GRAFT_FILE=/dev/null below is deliberate
)

# GIT_* variables the caller's environment may hold that would steer git elsewhere.
_DROP_PREFIXES = ("GIT_",)


@dataclasses.dataclass(frozen=True)
class Repo:
    """Where git must look, pinned: never rediscovered from files the agent controls."""

    git_dir: Path  # a linked worktree's admin dir, or the common dir itself
    common_dir: Path
    work_tree: Path | None = None
    # Set once the snapshot shows config or object-store steering files were changed:
    # from then on ccm-guard runs no git at all on this repository.
    untrusted: str | None = None

    def distrust(self, reason: str) -> "Repo":
        return dataclasses.replace(self, untrusted=reason)



@dataclasses.dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape")

    def z(self) -> list[str]:
        """NUL-separated output as a list (no trailing empty element)."""
        return [p for p in self.out.split("\0") if p]


@functools.lru_cache(maxsize=1)
def binary() -> str:
    found = shutil.which("git")
    if not found:
        raise GitError("git not found on PATH: install git (2.39 or newer) and try again")
    return os.path.realpath(found)


@functools.lru_cache(maxsize=1)
def _empty_home() -> str:
    # A HOME with nothing in it: no ~/.gitconfig, no ~/.config/git/{ignore,attributes}.
    return tempfile.mkdtemp(prefix="ccm-guard-githome-")


def environment(repo: Repo | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROP_PREFIXES)}
    env.pop("XDG_CONFIG_HOME", None)
    env.update(
        HOME=_empty_home(),
        LC_ALL="C",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_ATTR_NOSYSTEM="1",
        GIT_GRAFT_FILE="/dev/null",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_OPTIONAL_LOCKS="0",
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        PAGER="cat",
    )
    if repo is not None:
        env["GIT_DIR"] = str(repo.git_dir)
        env["GIT_COMMON_DIR"] = str(repo.common_dir)
        if repo.work_tree is not None:
            env["GIT_WORK_TREE"] = str(repo.work_tree)
    if extra:
        env.update(extra)
    return env


def run(
    args: Sequence[str],
    repo: Repo | None = None,
    *,
    cwd: Path | str | None = None,
    input: bytes | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    literal: bool = True,
) -> Result:
    """Run one hardened git command; raise GitError with the whole story on failure.

    Pathspecs are literal (a file the agent named `:(glob)*` is just that file), except
    where a command refuses pathspec magic altogether (`literal=False`).
    """
    if repo is not None and repo.untrusted:
        raise UntrustedRepoError(
            f"refusing to run git on {repo.common_dir}: {repo.untrusted}; "
            "inspect the repository by hand before trusting it again"
        )
    argv = (binary(), *HARDENING, *(("--literal-pathspecs",) if literal else ()), *args)
    if cwd is None:
        cwd = repo.work_tree if repo and repo.work_tree else (repo.git_dir if repo else "/")
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            env=environment(repo, env),
            check=False,
        )
    except OSError as exc:
        raise GitError(f"could not start git ({exc.strerror}): check that {argv[0]} works") from exc
    result = Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise GitError(describe_failure(result))
    return result


def describe_failure(result: Result) -> str:
    lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
    why = lines[-1] if lines else "no message"
    return f"git {' '.join(result.args)} failed (exit {result.returncode}): {why}"


# --- discovery (runs on the person's repository, before any agent exists) -----------------


@dataclasses.dataclass(frozen=True)
class Discovered:
    git_dir: Path
    common_dir: Path
    toplevel: Path

    def repo(self) -> "Repo":
        return Repo(self.git_dir, self.common_dir, self.toplevel)


def discover(path: Path) -> Discovered:
    """Find the repository that holds `path`; refuse what exec cannot use."""
    if not path.is_dir():
        raise RepoError(f"{path} is not a directory: run ccm-guard inside a git repository or pass --repo")
    query = ["rev-parse", "--is-bare-repository", "--absolute-git-dir", "--git-common-dir"]
    res = run([*query, "--show-toplevel"], cwd=path, check=False)
    if res.returncode != 0:  # no work tree, or no repository at all: ask again to tell which
        res = run(query, cwd=path, check=False)
    if res.returncode != 0:
        raise NotARepository(f"{path} is not in a git repository: run `git init` first or pass --repo PATH")
    bare, git_dir, common, *top = res.out.splitlines()
    if bare == "true":
        raise RepoError(
            f"{git_dir} is a bare repository: ccm-guard needs a checkout; clone it first "
            "(git clone BARE checkout) and run there"
        )
    common_path = Path(common)
    if not common_path.is_absolute():
        common_path = Path(path, common_path)
    if not top:
        raise RepoError(f"{path} is inside a git directory, not a work tree: cd into the checkout")
    return Discovered(
        git_dir=Path(os.path.realpath(git_dir)),
        common_dir=Path(os.path.realpath(common_path)),
        toplevel=Path(os.path.realpath(top[0])),
    )


# --- typed queries ---------------------------------------------------------------------------


def resolve_commit(repo: Repo, rev: str) -> str | None:
    res = run(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def symbolic_head(repo: Repo) -> str | None:
    res = run(["symbolic-ref", "--quiet", "HEAD"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def ref_exists(repo: Repo, ref: str) -> bool:
    return run(["rev-parse", "--verify", "--quiet", ref], repo, check=False).returncode == 0


def check_branch_name(name: str) -> bool:
    return run(["check-ref-format", "--branch", name], check=False).returncode == 0


def worktree_add(repo: Repo, path: Path, branch: str, base: str) -> None:
    run(["worktree", "add", "--quiet", "-b", branch, str(path), base], repo, cwd="/")


def worktree_remove(repo: Repo, path: Path) -> None:
    # Twice --force: also removes a worktree that is locked or has modifications.
    run(["worktree", "remove", "--force", "--force", str(path)], repo, cwd="/")


def worktree_prune(repo: Repo) -> None:
    run(["worktree", "prune"], repo, cwd="/")


def update_ref(repo: Repo, ref: str, new: str, old: str | None = None, message: str = "ccm-guard") -> None:
    args = ["update-ref", "-m", message, ref, new]
    if old is not None:
        args.append(old)
    run(args, repo)


def delete_ref(repo: Repo, ref: str, old: str) -> None:
    """Delete `ref` only if it still points at `old` (compare-and-swap)."""
    run(["update-ref", "-d", ref, old], repo)


def drop_ref(repo: Repo, ref: str) -> None:
    """Delete a private ref whatever it points at (a missing one is fine)."""
    run(["update-ref", "-d", ref], repo)


def commit_message(repo: Repo, commit: str) -> str:
    return run(["log", "-1", "--format=%B", commit, "--"], repo).out


def is_ancestor(repo: Repo, ancestor: str, descendant: str) -> bool:
    res = run(["merge-base", "--is-ancestor", ancestor, descendant], repo, check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    return res.returncode == 0


def merge_base(repo: Repo, a: str, b: str) -> str:
    return run(["merge-base", a, b], repo).out.strip()


@dataclasses.dataclass(frozen=True)
class MergeResult:
    tree: str | None  # None when the merge conflicts
    conflicts: dict[str, str]  # path -> git's CONFLICT message


def merge_tree(repo: Repo, ours: str, theirs: str) -> MergeResult:
    """Merge two commits in the object store only (no index, no work tree touched)."""
    res = run(["merge-tree", "--write-tree", "-z", "--name-only", ours, theirs], repo, check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    head, _, messages = res.out.partition("\0\0")
    tree, *names = head.split("\0")
    # Messages: <count> NUL <count paths> NUL <type> NUL <text> NUL, repeated.
    conflicts = {name.rstrip("\0"): "conflict" for name in names if name}
    fields = messages.split("\0")
    i = 0
    while i < len(fields) and fields[i].isdigit():
        count = int(fields[i])
        paths, kind, text = fields[i + 1:i + 1 + count], fields[i + 1 + count], fields[i + 2 + count]
        if kind.startswith("CONFLICT"):
            for path in paths:
                conflicts[path] = text.strip()
        i += count + 3
    return MergeResult(tree if res.returncode == 0 else None, conflicts)


def commit_tree(repo: Repo, tree: str, parents: Sequence[str], message: str, identity: Mapping[str, str]) -> str:
    args = ["commit-tree", tree]
    for parent in parents:
        args += ["-p", parent]
    return run([*args, "-F", "-"], repo, env=identity, input=message.encode()).out.strip()


def try_update_ref(repo: Repo, ref: str, new: str, old: str, message: str) -> bool:
    """Compare-and-swap: move `ref` from `old` to `new`; False if it was not at `old`."""
    res = run(["update-ref", "-m", message, ref, new, old], repo, check=False)
    if res.returncode == 0:
        return True
    if resolve_commit(repo, ref) != old:
        return False  # somebody else moved it first: the caller recomputes and retries
    raise GitError(describe_failure(res))


def count_commits(repo: Repo, base: str, head: str) -> int:
    return int(run(["rev-list", "--count", f"{base}..{head}"], repo).out.strip() or 0)


@dataclasses.dataclass(frozen=True)
class WorktreeEntry:
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


def fast_forward_checkout(repo: Repo, old: str, new: str) -> None:
    """Bring a clean checkout at `old` to `new`: index and changed files only (two-tree merge)."""
    run(["read-tree", "-m", "-u", old, new], repo)


def diff_text(repo: Repo, base: str, head: str) -> str:
    return run(["diff", "--no-ext-diff", "--no-textconv", "--stat", "--patch", base, head, "--"], repo).out


def fetch_ref(repo: Repo, url: str, branch: str, into: str) -> str | None:
    """Fetch `branch` of `url` into the private ref `into`; None when the remote lacks it."""
    res = run(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", url, f"+refs/heads/{branch}:{into}"],
              repo, check=False)
    if res.returncode != 0:
        if b"couldn't find remote ref" in res.stderr:
            return None
        raise GitError(describe_failure(res))
    return resolve_commit(repo, into)


def push_ref(repo: Repo, url: str, commit: str, branch: str) -> str | None:
    """Push without force; the rejection message when the remote moved, None on success."""
    res = run(["push", "--porcelain", url, f"{commit}:refs/heads/{branch}"], repo, check=False)
    if res.returncode == 0:
        return None
    text = (res.stdout + res.stderr).decode("utf-8", "replace")
    # A lost race shows as a rejection, or (two pushes at the same moment) as the remote
    # failing to lock or update the ref it was about to move.
    races = ("fetch first", "non-fast-forward", "[rejected]", "stale info", "cannot lock ref",
             "failed to update ref", "incorrect old value")
    if any(sign in text for sign in races):
        return text.strip().splitlines()[-1] if text.strip() else "rejected"
    raise GitError(describe_failure(res))


def remote_url(repo: Repo, name: str) -> str | None:
    res = run(["config", "--get", f"remote.{name}.url"], repo, check=False)
    return res.out.strip() or None


def refs_under(repo: Repo, prefix: str) -> dict[str, str]:
    out = run(["for-each-ref", "--format=%(refname) %(objectname)", prefix], repo).out
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


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


def has_any_commit(repo: Repo) -> bool:
    return bool(run(["rev-list", "-n1", "--all"], repo).out.strip())


def tree_of(repo: Repo, commit: str) -> str:
    return run(["rev-parse", f"{commit}^{{tree}}"], repo).out.strip()


def index_paths(repo: Repo) -> list[str]:
    return run(["ls-files", "-z", "--cached"], repo).z()


# What a range of two commit ids holds never changes: one process asks once (a run's
# gates, verdict and snapshots all want the same range).
_RANGES: dict[tuple[str, str, str, str], list[Any]] = {}


def _range_once(repo: Repo, kind: str, base: str, head: str, compute: Callable[[], list[Any]]) -> list[Any]:
    if not (_is_oid(base) and _is_oid(head)):
        return compute()
    key = (str(repo.common_dir), kind, base, head)
    if key not in _RANGES:
        _RANGES[key] = compute()
    return list(_RANGES[key])


def _is_oid(text: str) -> bool:
    return len(text) == 40 and all(c in "0123456789abcdef" for c in text)


def commits(repo: Repo, base: str, head: str) -> list[tuple[str, str]]:
    """(sha, subject) of each commit in base..head, oldest first."""
    def compute() -> list[Any]:
        out = run(["log", "--reverse", "--no-decorate", "-z", "--format=%H %s", f"{base}..{head}", "--"], repo).z()
        return [(record[:record.index(" ")], record[record.index(" ") + 1:]) for record in out]

    return _range_once(repo, "commits", base, head, compute)


@dataclasses.dataclass(frozen=True)
class FileStat:
    path: str
    added: int | None  # None for binary files
    deleted: int | None


def numstat(repo: Repo, base: str, head: str) -> list[FileStat]:
    def compute() -> list[Any]:
        out = run(["diff", "--numstat", "-z", "--no-renames", "--no-ext-diff", "--no-textconv", base, head, "--"],
                  repo).z()
        stats = []
        for record in out:
            added, deleted, path = record.split("\t", 2)
            stats.append(FileStat(path, None if added == "-" else int(added), None if deleted == "-" else int(deleted)))
        return stats

    return _range_once(repo, "numstat", base, head, compute)


@dataclasses.dataclass(frozen=True)
class StatusEntry:
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
    args = ["status", "--porcelain=v2", "-z", "--untracked-files=" + ("all" if untracked else "no"), "--no-renames",
            "--ignore-submodules=none"]
    if ignored:
        args.append("--ignored=matching")
    entries = []
    for record in run(args, repo).z():
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


@dataclasses.dataclass(frozen=True)
class IgnoreRule:
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


def blob_at(repo: Repo, rev: str, path: str) -> str | None:
    res = run(["rev-parse", "--verify", "--quiet", f"{rev}:{path}"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def hash_file(repo: Repo, path: str) -> str | None:
    res = run(["hash-object", "--no-filters", "--", path], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def verify_commit_graph(repo: Repo) -> bool:
    """Whether the commit-graph agrees with the commits it describes (git checks each one)."""
    objects = repo.common_dir / "objects"
    return run(["commit-graph", "verify", "--object-dir", str(objects)], repo, check=False).returncode == 0


def verify_pack(idx: Path) -> bool:
    """Whether a pack holds exactly the objects its index names (every object re-hashed)."""
    return run(["verify-pack", str(idx)], check=False).returncode == 0


@dataclasses.dataclass(frozen=True)
class RawChange:
    """One path changed, as `git diff --raw` reports it (renames split into delete + add)."""

    path: str
    status: str  # A, M, D, T
    old_mode: str
    new_mode: str
    old_blob: str
    new_blob: str
    where: str  # the commit that made the change, or "staged"


def _parse_raw(tokens: list[str], where: str) -> list[RawChange]:
    changes = []
    it = iter(tokens)
    for token in it:
        token = token.lstrip("\n")
        if token.startswith("commit "):
            where = token[len("commit "):]
        elif token.startswith(":"):
            old_mode, new_mode, old_blob, new_blob, status = token[1:].split(" ")
            changes.append(RawChange(next(it), status[0], old_mode, new_mode, old_blob, new_blob, where))
    return changes


def commit_changes(repo: Repo, base: str, head: str) -> list[RawChange]:
    """Every path each commit in base..head changed against its first parent, oldest first.

    Per commit, not base..head as a whole: a forbidden file changed and changed back,
    or a change brought in by a merge, is still seen.
    """
    out = run(["log", "--reverse", "-z", "--raw", "--no-renames", "--no-abbrev", "--diff-merges=first-parent",
               "--format=%x00commit %H", f"{base}..{head}", "--"], repo).out
    return _parse_raw(out.split("\0"), "")


def staged_changes(repo: Repo) -> list[RawChange]:
    out = run(["diff", "--cached", "-z", "--raw", "--no-renames", "--no-abbrev", "--no-ext-diff"], repo).out
    return _parse_raw(out.split("\0"), "staged")


def blobs(repo: Repo, ids: list[str]) -> dict[str, bytes]:
    """The contents of blobs by id, in one `cat-file --batch`."""
    if not ids:
        return {}
    out = run(["cat-file", "--batch"], repo, input="".join(f"{i}\n" for i in ids).encode()).stdout
    found: dict[str, bytes] = {}
    pos = 0
    while pos < len(out):
        header_end = out.index(b"\n", pos)
        oid, kind, size = out[pos:header_end].decode().split(" ")
        start = header_end + 1
        found[oid] = out[start:start + int(size)]
        pos = start + int(size) + 1
    return found


def blob_sizes(repo: Repo, ids: list[str]) -> dict[str, int]:
    if not ids:
        return {}
    out = run(["cat-file", "--batch-check=%(objectname) %(objectsize)"], repo,
              input="".join(f"{i}\n" for i in ids).encode()).out
    return {oid: int(size) for oid, _, size in (line.partition(" ") for line in out.splitlines()) if size.isdigit()}


def tree_paths(repo: Repo, rev: str) -> list[str]:
    return run(["ls-tree", "-r", "-z", "--name-only", "--full-tree", rev], repo).z()


def file_at(repo: Repo, rev: str, path: str) -> bytes | None:
    """A file's content at a commit, or None if it has none there."""
    return files_at(repo, rev, [path])[path]


def files_at(repo: Repo, rev: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """Files' contents at a commit (None: no such file there), in one `cat-file --batch`
    of REV:PATH names."""
    if any("\n" in p for p in paths):  # the batch reads names by line
        return {p: (blobs(repo, [oid]).get(oid) if (oid := blob_at(repo, rev, p)) else None) for p in paths}
    names = "".join(f"{rev}:{p}\n" for p in paths).encode("utf-8", "surrogateescape")
    out = run(["cat-file", "--batch"], repo, input=names).stdout
    found: dict[str, bytes | None] = {}
    pos = 0
    for path in paths:
        header_end = out.index(b"\n", pos)
        header = out[pos:header_end].decode("utf-8", "surrogateescape")
        pos = header_end + 1
        if header.endswith((" missing", " ambiguous")):
            found[path] = None
            continue
        _, kind, size = header.rsplit(" ", 2)
        found[path] = out[pos:pos + int(size)] if kind == "blob" else None
        pos += int(size) + 1
    return found


def global_config_files() -> list[Path]:
    """Where git looks for the user's global config, lowest precedence first (what
    GIT_CONFIG_GLOBAL would put in their place is the caller's to decide)."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return [Path(xdg, "git", "config"), Path(os.path.expanduser("~/.gitconfig"))]


def config_file_set(path: Path, key: str, value: str | None) -> None:
    """Set `key` in the config file `path`, or (None) remove every value of it."""
    if value is None:
        run(["config", "--file", str(path), "--unset-all", key], check=False)  # absent already: fine
    else:
        run(["config", "--file", str(path), key, value])


def config_entries(path: Path) -> list[tuple[str, str]]:
    """The key/value pairs of one config file, as git itself parses them; includes not followed.

    Reading a config file runs nothing, whoever wrote it.
    """
    res = run(["config", "--file", str(path), "--no-includes", "--list", "-z"], check=False)
    if res.returncode != 0:
        raise GitError(f"{path} is not a valid git config file: {describe_failure(res)}")
    pairs = []
    for record in res.z():
        key, _, value = record.partition("\n")
        pairs.append((key, value))
    return pairs


def tree_size(repo: Repo, rev: str) -> tuple[int, int]:
    """(files, bytes) a checkout of `rev` writes; used for the disk-space preflight."""
    out = run(["ls-tree", "-r", "-z", "--format=%(objecttype) %(objectsize)", rev], repo).z()
    files = total = 0
    for record in out:
        kind, size = record.split(" ", 1)
        if kind == "blob":
            files += 1
            total += int(size)
    return files, total


def archive_commit(repo: Repo, parent: str, message: str, identity: Mapping[str, str]) -> str:
    """A commit holding everything in the work tree (tracked and untracked, not ignored).

    Built in a private copy of the index, so neither the task's index nor its branch
    moves; the copy keeps git's stat cache, so only changed files are hashed again.
    """
    with tempfile.TemporaryDirectory(prefix="ccm-guard-archive-") as tmp:
        index = Path(tmp, "index")
        env = {"GIT_INDEX_FILE": str(index), **identity}
        try:
            shutil.copyfile(repo.git_dir / "index", index)
            run(["add", "--all", "--", "."], repo, env=env)
        except (OSError, GitError):
            # No usable index (the agent may have removed or corrupted it): start from the commit.
            index.unlink(missing_ok=True)
            run(["read-tree", parent], repo, env=env)
            run(["add", "--all", "--", "."], repo, env=env)
        tree = run(["write-tree"], repo, env=env).out.strip()
        return run(["commit-tree", tree, "-p", parent, "-F", "-"], repo, env=env, input=message.encode()).out.strip()


# --- ignored files, for .worktreeinclude ------------------------------------------------------


def ignored_untracked(repo: Repo) -> list[str]:
    """Untracked paths the repository's own ignore rules ignore, relative to the top.

    A directory git does not walk into (wholly ignored, `node_modules/`) is one entry
    ending in "/". Tracked files are never listed, ignored or not.
    """
    return run(["ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z"], repo).z()


def untracked_matching(repo: Repo, patterns: Path) -> list[str]:
    """Untracked paths the gitignore-style patterns in the file `patterns` match, whatever
    the repository's own ignore rules say; a directory whose untracked files all match is
    one entry ending in "/". git does the matching, so its rules (anchoring, `**`,
    negation, directory-only patterns) hold exactly.
    """
    return run(["ls-files", "--others", "--ignored", f"--exclude-from={patterns}", "--directory", "-z"], repo).z()


# --- the warm pool, sparse tasks and cheap removal (issue 7) ---------------------------------


def worktree_add_bare(repo: Repo, path: Path, branch: str, base: str) -> None:
    """`worktree add -b` without the checkout: the admin dir, HEAD and branch only (~10 ms
    at any size); `reset_hard` or a sparse setup fills the work tree afterwards."""
    run(["worktree", "add", "--quiet", "--no-checkout", "-b", branch, str(path), base], repo, cwd="/")


def reset_hard(repo: Repo, rev: str = "HEAD") -> None:
    """Index and work tree to `rev`; files whose stat data match are not rewritten, and a
    sparse checkout's patterns are honoured. (`worktree add` itself runs exactly this.)"""
    run(["reset", "--quiet", "--hard", "--no-recurse-submodules", rev, "--"], repo)


def worktree_unlock(repo: Repo, path: Path) -> None:
    run(["worktree", "unlock", str(path)], repo, cwd="/")


def sparse_set_cone(repo: Repo, directories: Sequence[str]) -> None:
    """Cone-mode sparse checkout of `directories` (from stdin: no name is taken for an
    option). Writes `info/sparse-checkout` in the admin dir, `core.sparseCheckout*` in its
    `config.worktree`, and `extensions.worktreeConfig` in the shared config if unset."""
    data = "".join(f"{d}\n" for d in directories).encode("utf-8", "surrogateescape")
    run(["sparse-checkout", "set", "--cone", "--stdin"], repo, input=data, literal=False)


def object_type(repo: Repo, rev: str, path: str) -> str | None:
    """"tree", "blob", "commit" (a gitlink) ... of `path` at `rev`, or None if it has none."""
    res = run(["cat-file", "-t", f"{rev}:{path}"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


# --- gc: which refs keep a piece of work, and the index of a vanished worktree ---------------


@dataclasses.dataclass(frozen=True)
class RefTree:
    ref: str
    commit: str
    tree: str  # the tree of the commit the ref points at (an annotated tag is peeled)


def ref_trees(repo: Repo, contains: str | None = None) -> list[RefTree]:
    """Every ref (only those whose history holds `contains`, when given) with its tree."""
    fmt = "--format=%(refname)%00%(objectname)%00%(tree)%00%(*objectname)%00%(*tree)"
    args = ["for-each-ref", fmt] + ([f"--contains={contains}"] if contains else [])
    found = []
    for line in run(args, repo).out.splitlines():
        ref, commit, tree, peeled, peeled_tree = line.split("\0")
        if tree or peeled_tree:  # refs to blobs or trees keep no commit
            found.append(RefTree(ref, peeled or commit, tree or peeled_tree))
    return found


def index_tree(repo: Repo, index: Path) -> str | None:
    """The tree an index file describes (what was staged there), or None when git cannot
    write one from it (unmerged entries, missing objects, not an index at all)."""
    res = run(["write-tree"], repo, env={"GIT_INDEX_FILE": str(index)}, check=False)
    return res.out.strip() if res.returncode == 0 else None


def tree_blobs(repo: Repo, rev: str) -> dict[str, tuple[str, str]]:
    """path -> (mode, object id) of every file in `rev`'s tree."""
    found = {}
    for record in run(["ls-tree", "-r", "-z", "--full-tree", rev], repo).z():
        meta, _, path = record.partition("\t")
        mode, _, oid = meta.split(" ")
        found[path] = (mode, oid)
    return found


def hash_files(repo: Repo, paths: Sequence[Path]) -> list[str]:
    """The blob ids of files as they are on disk (no filters), in one git process."""
    if not paths:
        return []
    data = "".join(f"{p}\n" for p in paths).encode("utf-8", "surrogateescape")
    return run(["hash-object", "--no-filters", "--stdin-paths"], repo, input=data).out.split()


# --- pool worktrees without an admin entry (issue 7) ------------------------------------------
# A pooled work tree is a directory and ccm-guard's own index file, with no entry under
# <common>/worktrees: nothing a running task's snapshot sees. Git is run on it as the
# common dir's work tree with a private index (GIT_INDEX_FILE); the main worktree's own
# config.worktree is read then, so its sparse settings are switched off for these calls.

_PRIVATE_INDEX_CONFIG = {
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "core.sparseCheckout", "GIT_CONFIG_VALUE_0": "false",
    "GIT_CONFIG_KEY_1": "index.sparse", "GIT_CONFIG_VALUE_1": "false",
}


def checkout_with_index(repo: Repo, index: Path, rev: str) -> None:
    """Write `rev`'s files into repo.work_tree, recording them in the index file `index`
    (made if missing). No ref, HEAD or other index is touched."""
    run(["read-tree", "--reset", "-u", rev], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG})


def refresh_with_index(repo: Repo, index: Path) -> None:
    run(["update-index", "-q", "--refresh"], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG},
        check=False)


def status_with_index(repo: Repo, index: Path) -> list[StatusEntry]:
    """`status` of repo.work_tree against the index file `index`, ignored files included.
    (Its index-against-HEAD half compares with the common dir's HEAD: callers look only at
    the work tree side.)"""
    args = ["status", "--porcelain=v2", "-z", "--untracked-files=all", "--no-renames", "--ignore-submodules=none",
            "--ignored=matching"]
    out = run(args, repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG}).z()
    entries = []
    for record in out:
        if record[0] in "?!":
            entries.append(StatusEntry(record[0] * 2, record[2:]))
        elif record[0] == "1":
            fields = record.split(" ", 8)
            entries.append(StatusEntry(fields[1], fields[8], fields[3], fields[6]))
        elif record[0] == "u":
            fields = record.split(" ", 10)
            entries.append(StatusEntry(fields[1], fields[10], fields[3], fields[7]))
    return entries




def trees_of(repo: Repo, revs: Sequence[str]) -> list[str]:
    """The tree of each commit in `revs`, in one git process."""
    return run(["rev-parse", *(f"{rev}^{{tree}}" for rev in revs)], repo).out.split()


def clean_with_index(repo: Repo, index: Path) -> None:
    """`clean_all` for a work tree whose index is the file `index`."""
    run(["clean", "-ffdxq"], repo, env={"GIT_INDEX_FILE": str(index), **_PRIVATE_INDEX_CONFIG})


# A private index over a work tree (recovery commits on the agent's behalf with one, so the
# agent's staging plays no part). Unlike the pool's, it keeps the task's own sparse settings.


def index_from(repo: Repo, index: Path, rev: str) -> None:
    """Make the index file `index` hold exactly `rev`'s tree (its stat cache kept, if any)."""
    run(["read-tree", "--reset", rev], repo, env={"GIT_INDEX_FILE": str(index)})


def changed_with_index(repo: Repo, index: Path) -> list[str]:
    """Paths whose work-tree state differs from HEAD in the index file `index`, plus
    untracked files that are not ignored."""
    env = {"GIT_INDEX_FILE": str(index)}
    # Refresh first: diff-index reports every entry whose stat data is stale as changed.
    run(["update-index", "-q", "--refresh", "--ignore-submodules"], repo, env=env, check=False)
    tracked = run(["diff-index", "-z", "--name-only", "--no-renames", "HEAD", "--"], repo, env=env).z()
    untracked = run(["ls-files", "-z", "--others", "--exclude-standard", "--"], repo, env=env).z()
    # A nested repository is listed as "dir/"; update-index wants the path without it.
    return sorted(set(tracked) | {p.rstrip("/") for p in untracked})


def stage_with_index(repo: Repo, index: Path, paths: Sequence[str]) -> str:
    """Record the work tree's state of `paths` in the index file `index`; its tree id.
    update-index takes the paths literally from stdin (no pathspec magic, no argv limit),
    --add for new files, --remove for deleted ones."""
    env = {"GIT_INDEX_FILE": str(index)}
    data = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    run(["update-index", "--add", "--remove", "-z", "--stdin"], repo, env=env, input=data)
    return run(["write-tree"], repo, env=env).out.strip()


def reset_index(repo: Repo, rev: str) -> None:
    """The work tree's own index to `rev`, its files untouched (`git reset --mixed`)."""
    run(["read-tree", "--reset", rev], repo)


def numstat_trees(old: Path, new: Path) -> dict[str, tuple[int | None, int | None]]:
    """Lines added and deleted per file from directory `old` to directory `new`, outside any
    repository (`git diff --no-index`), keyed by the path relative to them; (None, None)
    for a binary file. git's diff, not Python's: difflib takes minutes on some inputs an
    agent can write.
    """
    res = run(["diff", "--no-index", "--no-renames", "--numstat", "-z", "--no-ext-diff", "--no-textconv",
               "--", str(old), str(new)], check=False)
    if res.returncode not in (0, 1):
        raise GitError(describe_failure(res))
    tokens = res.out.split("\0")
    found: dict[str, tuple[int | None, int | None]] = {}
    for i in range(0, len(tokens) - 2, 3):  # "ADDED\tDELETED\t", the old path, the new path
        added, deleted, _ = tokens[i].split("\t", 2)
        gone = tokens[i + 2] == os.devnull
        rel = os.path.relpath(tokens[i + 1] if gone else tokens[i + 2], old if gone else new)
        found[rel] = (None, None) if added == "-" else (int(added), int(deleted))
    return found
