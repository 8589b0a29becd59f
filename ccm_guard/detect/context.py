"""What a gate sees of a run, what it reports, and when git may no longer be run.

A gate gets a Context (pinned paths, the two snapshots and their delta, the person's
checkout before and after) and returns Findings, or raises Skipped when it cannot judge
(git refused on a tampered repository).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Mapping, TypeVar

from ccm_guard import git
from ccm_guard.detect.delta import Delta
from ccm_guard.detect.paths import from_raw, from_status
from ccm_guard.detect.snapshot import Entry, Snapshot, file_identity
from ccm_guard.errors import GitError, UntrustedRepoError
from ccm_guard.git import config as configfile
from ccm_guard.later import Later
from ccm_guard.pathrules.check import PathChange
from ccm_guard.policy import Role
from ccm_guard.state.pins import Pins

FAIL = "fail"
WARN = "warn"
_GONE = Entry("-", 0, "")


@dataclasses.dataclass(frozen=True)
class Finding:
    """One thing a gate found: why, which paths, and whether it fails the run or warns."""

    gate: str
    reason: str
    paths: tuple[str, ...] = ()
    severity: str = FAIL


class Skipped(Exception):
    """The gate could not judge; the reason says why (and the verdict fails)."""


# What git deletes when a rebase, revert or cherry-pick ends: a pseudo-ref, which git 2.39
# deletes through a ref transaction that locks packed-refs, out of a sandboxed task's reach.
_PSEUDOREFS = ("CHERRY_PICK_HEAD", "REVERT_HEAD", "REBASE_HEAD")
# What such an operation leaves while it is not finished.
_UNFINISHED = ("MERGE_HEAD", "MERGE_MSG", "rebase-merge", "rebase-apply", "sequencer")


@dataclasses.dataclass(kw_only=True)
class Context:
    """Everything a gate may look at, gathered once per judgement."""

    pins: Pins
    repo: git.Repo  # the task's worktree, pinned; `untrusted` once metadata was tampered with
    base: str
    before: Snapshot
    after: Snapshot
    delta: Delta
    main_repo: git.Repo | None = None  # the person's checkout (None: it is not to be looked at)
    main_files_before: Mapping[str, str] | None = None  # the person's dirty/untracked files -> identity
    main_files_after: Mapping[str, str] | None = None
    # admin dir name -> branch ref, of the other registered tasks
    other_tasks: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # The refs under refs/ccm-guard/ that ccm-guard commands recorded writing, on rows that
    # changed during the run (ref -> the commit recorded, None where any): a discard's
    # archive, a snapshot, an apply's push record.
    recorded_refs: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    leftovers: tuple[str, ...] = ()  # processes the agent left running (already killed)
    # The task worktree's status (ignored paths included), when it was read ahead in parallel.
    task_status: Later[list[git.StatusEntry]] | None = None
    role: Role | None = None  # the role whose path rules and limits apply (None: no policy)
    # Ref moves other ccm-guard processes made and recorded in the registry (applies and
    # rollbacks, as (ref, old, new)): the registry is out of the agent's reach.
    ccm_moves: tuple[tuple[str, str, str], ...] = ()
    # Commits ccm-guard itself made on the task's branch (a recovery commit): they carry
    # its trailers and identity by right.
    ccm_commits: tuple[str, ...] = ()
    # Whether the agent could write the registry (no sandbox): then ccm_moves and
    # ccm_commits are claims the agent could have made, and excuses based on them are
    # reported as unverified.
    registry_reachable: bool = False
    # What the setup step left uncommitted (path -> file_identity): the run's starting point,
    # not the agent's doing, while it stays as setup left it.
    setup_files: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def status(self) -> list[git.StatusEntry]:
        if self.task_status is None:
            repo = self.repo
            # No copy of the index from before to go by: every file is read.
            self.task_status = Later(lambda: git.status_without_trusting_index(repo, None, ignored=True), thread=False)
        return git_or_skip(self.task_status.result)

    def left(self) -> list[git.StatusEntry]:
        """The task worktree's status less what the setup step left and the run did not
        touch since: the work tree as the agent left it."""
        entries = self.status()
        if not self.setup_files:
            return entries
        # The file's own identity, not its status code: setup's were read against the task's
        # index, the run's against ccm-guard's (a file setup staged is untracked there). A
        # path the commits touched is the agent's, however its file on disk stayed.
        committed = {c.path for c in self.committed}

        def setups(entry: git.StatusEntry) -> bool:
            recorded = self.setup_files.get(entry.path)
            now = file_identity(self.pins.worktree, entry)
            return (recorded is not None and entry.path not in committed
                    and recorded.partition(":")[2] == now.partition(":")[2])

        return [e for e in entries if not setups(e)]

    @functools.cached_property
    def committed(self) -> list[git.RawChange]:
        """What the commits of base..head changed, commit by commit."""
        head = self.head
        return git.commit_changes(self.repo, self.base, head) if head and head != self.base else []

    @functools.cached_property
    def path_changes(self) -> list[PathChange]:
        """Every path the run changed: commit by commit, then what is left in the work tree."""
        return from_raw(self.committed) + from_status(self.left(), self.pins.worktree)

    @property
    def head(self) -> str | None:
        value = self.after.refs.get(self.pins.branch_ref)
        return value if plain(value) else None

    @functools.cached_property
    def tasks_at_work(self) -> set[str]:
        """Other tasks (admin dir names) running now, or whose state changed since this run's
        first snapshot (finished, cleaned up or applied meanwhile)."""
        from pathlib import Path

        from ccm_guard.state.registry import Registry

        found: set[str] = set()
        try:
            registry = Registry()
            try:
                found = {Path(task.admin_dir or task.worktree).name
                         for task in registry.at_work(str(self.pins.common_dir), self.before.taken_at)}
            finally:
                registry.close()
        except Exception:
            found = set(self.other_tasks)  # no registry to ask: excuse them, as their own gates judge them
        return found

    @functools.cached_property
    def config_changes(self) -> dict[str, list[configfile.ConfigChange]]:
        """Key-by-key changes of every changed config file (parsing runs no code)."""
        found = {}
        for change in self.delta.files:
            name = change.key.rsplit("/", 1)[-1]
            if change.key.startswith(("include/", "hostconfig/")) or (
                    change.key.startswith("common/") and name in ("config", "config.worktree")):
                old, new = self.before.contents.get(change.key), self.after.contents.get(change.key)
                if new is None and self.after.files.get(change.key, _GONE).kind == "f":
                    # Too large to read (snapshot.CONFIG_LIMIT): git reads it all the same.
                    found[change.key] = [configfile.ConfigChange("(config file too large to read)", (), ("?",), True)]
                    continue
                found[change.key] = configfile.diff(old, new)
        return found

    @functools.cached_property
    def finished_pseudorefs(self) -> list[str]:
        """The task's pseudo-refs (snapshot keys) that a finished rebase, revert or
        cherry-pick left only because the sandbox kept git from deleting them: nothing of
        an unfinished one is there (no MERGE_MSG, no rebase or sequencer state, no unmerged
        index entry). Warned of by git-metadata, removed by judge."""
        own = f"common/worktrees/{self.pins.admin_name}/"
        added = [own + name for name in _PSEUDOREFS
                 if own + name in self.after.files and own + name not in self.before.files]
        if not added or any(own + name in self.after.files for name in _UNFINISHED):
            return []
        try:
            unmerged = git.staged_changes(self.repo)
        except (GitError, UntrustedRepoError):
            return []  # cannot tell: not taken for finished
        return [] if any(e.code.startswith("U") for e in unmerged) else added

    @functools.cached_property
    def forged_packs(self) -> list[str]:
        """New packs (and a new multi-pack index) that do not verify: an object in them
        does not hash to the name its index gives it, so it could stand in for an existing
        one. Git's own packs (gc, fetch) always verify."""
        objects_dir = self.pins.common_dir / "objects"
        fmt = git.object_format(self.pins.common_dir)
        forged = [p for p in self.delta.objects.new_packs if not git.verify_pack(objects_dir / p, fmt)]
        if self.delta.objects.midx_changed and not git.verify_midx(objects_dir, fmt):
            forged.append("pack/multi-pack-index")
        return forged

    @functools.cached_property
    def commit_graph_ok(self) -> bool:
        """A rewritten commit-graph is what `git gc` leaves, if it describes the real commits."""
        try:
            return git.verify_commit_graph(self.repo)
        except GitError:
            return False

    def ignored_worktree(self, key: str) -> bool:
        """Another registered task's admin dir: that task's own gates judge it."""
        parts = key.split("/")
        return len(parts) > 2 and parts[1] == "worktrees" and parts[2] in self.other_tasks


def untrusted_reason(ctx: Context) -> str | None:
    """Why ccm-guard must not run git on this repository any more, if it must not."""
    for key, changes in ctx.config_changes.items():
        if ctx.ignored_worktree(key) or key.startswith("hostconfig/"):
            continue  # (ccm-guard's own git reads no global config)
        dangerous = [c.key for c in changes if c.dangerous and not c.ccm_guard_setup]
        if dangerous or key.startswith("include/"):
            return f"{display(key)} gained keys that run code or steer git ({', '.join(dangerous) or 'include'})"
    # git reads a worktree's `commondir` itself for its refs, whatever GIT_COMMON_DIR says,
    # and `gitdir` when removing it; alternates, shallow and rewritten objects change what
    # history it sees.
    own = f"common/worktrees/{ctx.pins.admin_name}/"
    for key in ("common/objects/info/alternates", "common/shallow", "pointer", own + "commondir", own + "gitdir"):
        if ctx.delta.changed(key):
            return f"{display(key)} was changed"
    if ctx.delta.objects.altered or ctx.delta.objects.removed or ctx.forged_packs or ctx.delta.objects.forged:
        return "existing objects were rewritten or removed, or new ones forged"
    planted = planted_links(ctx)
    if planted:
        return f"{planted[0]} became a link or a special file"
    return None


def plants(ctx: Context) -> list[str]:
    """What the run left that would run code, or be written through, as soon as the person
    runs git (relative to the common dir): the task's config.worktree if it gained keys
    that run code, hooks the run added to the repository's hooks directory, and links
    planted in the git metadata. Moved aside before the person is handed the worktree."""
    found = []
    own = f"common/worktrees/{ctx.pins.admin_name}/config.worktree"
    if any(c.dangerous and not c.ccm_guard_setup for c in ctx.config_changes.get(own, [])):
        found.append(display(own))
    found += [display(c.key) for c in ctx.delta.files
              if c.change == "added" and c.key.startswith("common/hooks/")
              and ctx.after.files.get(c.key, _REGULAR).kind != "d"]
    # The repository's own config stays where it is, link or not: moving it would take the
    # person's remotes and settings with it (git-metadata names it, and git is not run).
    found += [p for p in planted_links(ctx) if p not in found and p not in _THE_PERSONS]
    return found


_THE_PERSONS = ("config", "config.worktree")


def config_plants(ctx: Context) -> list[dict[str, object]]:
    """Keys that run code which appeared during the run in the repository's own config
    (`config`, and the main worktree's `config.worktree`), as {file, key, values}. The
    file itself stays (it holds the person's remotes and settings); dispose unsets just
    these keys and keeps them in the task's logs, so the person's next `git status` runs
    none of them. Only when the agent could have written them (no sandbox: with it, the
    file is out of the agent's reach, so a new key is somebody else's), only keys that were
    unset before the run (a value of the person's is never touched), and only while no
    other task was at work on the repository (its agent may have planted them, and its own
    gates must still see them)."""
    if not ctx.registry_reachable or ctx.tasks_at_work - {ctx.pins.admin_name}:
        return []
    return [{"file": name, "key": change.key, "values": list(change.after)}
            for name in _THE_PERSONS
            for change in ctx.config_changes.get(f"common/{name}", [])
            if change.dangerous and not change.ccm_guard_setup and not change.before and change.after
            and not change.key.startswith("(")]  # "(unparseable config)": nothing to unset


def planted_links(ctx: Context) -> list[str]:
    """Links and special files (FIFOs, sockets) the run put into the git metadata. Git
    writes through links (a reflog, the index): ccm-guard's next commit or archive there
    would write into whatever file the agent chose."""
    return [display(change.key) for change in ctx.delta.files
            if change.change != "removed" and change.key.startswith("common/")
            and not ctx.ignored_worktree(change.key)  # another task's: its own run judges it
            and not change.key.endswith("/fsmonitor--daemon.ipc")  # git's own socket
            and ctx.after.files.get(change.key, _REGULAR).kind in ("l", "o")]


_REGULAR = Entry("f", 0, "")


def plain(value: str | None) -> bool:
    """A ref's snapshot value is a plain object id (not a symref, nor "unreadable ...")."""
    return value is not None and len(value) >= 40 and " " not in value


def display(key: str) -> str:
    if key == "pointer":
        return ".git (the worktree's pointer file)"
    return key.split("/", 1)[1] if "/" in key else key


T = TypeVar("T")


def git_or_skip(call: Callable[[], T]) -> T:
    try:
        return call()
    except UntrustedRepoError as exc:
        raise Skipped(exc.message) from exc
