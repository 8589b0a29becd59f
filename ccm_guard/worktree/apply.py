"""`task apply`: land a task's work on a branch without touching any working tree.

`git merge-tree --write-tree` computes the result in the object store, `commit-tree`
makes the commit, and `update-ref REF NEW OLD` moves the target only if nobody moved it
first (compare-and-swap); a lost race recomputes against the new tip. A target that is
checked out is brought up to date afterwards, as `git merge` would: the person's own
changes stay, and one in the apply's way refuses it (the branch is put back). A remote target is
pushed to, and a rejected push is fetched, rebuilt and retried
(docs/design-notes.md#apply-by-compare-and-swap).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

from ccm_guard import failpoints, git, worktree
from ccm_guard.errors import ApplyRefused, GitError, RepoError, StateError, UsageError
from ccm_guard.files import read_regular
from ccm_guard.git import layout
from ccm_guard.later import Later
from ccm_guard.pathrules.check import GITLINK
from ccm_guard.state.home import admin_lock
from ccm_guard.state.registry import Registry, Task, in_flight
from ccm_guard.text import first_few

STRATEGIES = ("merge", "squash", "ff")
MAX_ATTEMPTS = 25  # local compare-and-swap: each lost race means another apply landed
PUSH_RETRIES = 10


@dataclasses.dataclass(frozen=True)
class Target:
    """Where a task is applied: a local branch, or a remote one to push to."""

    ref: str  # refs/heads/<branch>
    url: str | None = None  # a remote target: where to push

    @property
    def name(self) -> str:
        short = self.ref.removeprefix("refs/heads/")
        return f"{self.url} {short}" if self.url else short


@dataclasses.dataclass(frozen=True)
class Applied:
    """What applying a task did to its target."""

    task: str
    target: str
    strategy: str
    old: str
    new: str
    files: int
    insertions: int
    deletions: int
    attempts: int
    checkout: str | None  # the checkout that was brought up to date, if any
    remote: str | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def apply_task(registry: Registry, task_id: str, into: str | None = None, strategy: str = "merge",
               retries: int = PUSH_RETRIES) -> Applied:
    if strategy not in STRATEGIES:
        raise UsageError(f"unknown strategy {strategy!r}: choose one of {', '.join(STRATEGIES)}")
    task = registry.get(task_id)
    reconcile(registry, task)
    task = registry.get(task_id)
    pending = task.option("applying")
    if pending and in_flight(pending):
        raise ApplyRefused(f"task {task.id} is being applied by process {pending['pid']}: wait for it, then "
                           f"`ccm-guard task show {task.id}`")
    host = layout.host_repo(Path(task.repo))
    head = _judged_head(host, task)
    store = _store_check(registry, host, task)
    target = resolve_target(host, task, into)
    if target.url:
        return _apply_remote(registry, task, host, head, target, strategy, retries, store)
    return _apply_local(registry, task, host, head, target, strategy, store)


def _judged_head(host: git.Repo, task: Task) -> str:
    """The task's tip, as long as it is what its gates passed."""
    if task.status == "APPLIED":
        applied = task.option("applied") or {}
        raise ApplyRefused(f"task {task.id} is already applied into {applied.get('target')} as "
                           f"{str(applied.get('new'))[:12]}; `ccm-guard task rollback {task.id}` undoes it")
    if task.status != "COMMITTED":
        raise StateError(f"task {task.id} is {task.status}: only a task that passed its gates (COMMITTED) "
                         f"can be applied; `ccm-guard audit --accept {task.id}` judges it again and, if it "
                         "passes, records it as COMMITTED")
    head = git.branch_tip(host, f"refs/heads/{task.branch}")
    if head is None:
        raise StateError(f"task {task.id}'s branch {task.branch} is gone: `ccm-guard task restore {task.id}`")
    judged = json.loads(task.verdict).get("head") if task.verdict else None
    if head != judged:
        raise ApplyRefused(f"branch {task.branch} moved since its gates passed ({str(judged)[:12]} -> {head[:12]}): "
                           f"`ccm-guard audit --accept {task.id}` judges it again and records the new head")
    if head == task.base:
        raise ApplyRefused(f"task {task.id} has no commits to apply")
    return head


StoreCheck = Later[list[str]] | None  # the object files found forged, once the check has run


def _store_check(registry: Registry, host: git.Repo, task: Task) -> StoreCheck:
    """Start checking that every object file added since the task began holds what its
    name says: git reads an object by its id from wherever it finds it, so a pack another
    task's agent forged after this task's gates (its own run fails only when it ends)
    would put other bytes into the person's checkout. Asked only where another task was at
    work on the repository since (the person's own objects need no check). It hashes on a
    thread while git merges, and `_built` waits for it before anything moves."""
    from ccm_guard.detect.objects import forged_since

    others = [t for t in registry.at_work(task.repo, since=task.created_at) if t.id != task.id]
    if not others:
        return None
    # One that began earlier and has not passed its gates (still at work, or failed) may
    # have forged a file before this task began, which this task's commit then only
    # freshened: from when the first of those began. One that passed had what it wrote
    # judged by the same checks.
    since = min([task.created_at, *(t.created_at for t in others if not _passed(t))])
    objects, form = host.common_dir / "objects", git.object_format(host.common_dir)
    return Later(lambda: forged_since(objects, since, form))


def _built(host: git.Repo, task: Task, head: str, old: str, strategy: str, store: StoreCheck) -> str:
    """The commit to move the target to (`build`), once the store is known sound: a forged
    store is said first, even where the merge failed too."""
    try:
        new = build(host, task, head, old, strategy)
    except Exception:  # (not a Ctrl-C: that does not wait for the hashing)
        _require_sound(store)
        raise
    _require_sound(store)
    return new


def _require_sound(store: StoreCheck) -> None:
    forged = store.result() if store is not None else []
    if forged:
        raise ApplyRefused(f"{len(forged)} object file(s) written while other tasks were at work do not hold "
                           f"what their names say ({forged[0]}): another agent may have forged them; find out "
                           "with `git fsck` (and `ccm-guard task list`: which run was at work), then apply again")


def _passed(task: Task) -> bool:
    try:
        return bool(task.verdict) and json.loads(task.verdict or "{}").get("passed") is True
    except ValueError:
        return False


def resolve_target(host: git.Repo, task: Task, into: str | None) -> Target:
    """--into: a local branch, REMOTE/BRANCH of a configured remote, or a repository path
    (pushed to on the branch of the same name as your checkout's). Default: the branch
    checked out where exec was started."""
    if into is None or os.path.isdir(into or ""):
        current = git.current_branch(git.Repo(Path(task.main_git_dir), Path(task.repo)))
        if current is None or not current.startswith("refs/heads/"):
            raise UsageError(f"{task.main_worktree} is on a detached HEAD: pass --into BRANCH")
        if into is not None:
            return Target(current, url=os.path.realpath(into))
        return Target(current)
    ref = into if into.startswith("refs/heads/") else f"refs/heads/{into}"
    if ref == f"refs/heads/{task.branch}":
        raise UsageError(f"--into {into} is the task's own branch: name the branch the work should land on")
    if git.ref_exists(host, ref):
        return Target(ref)
    remote, _, branch = into.partition("/")
    url = git.remote_url(host, remote) if branch else None
    if url:
        return Target(f"refs/heads/{branch}", url=url)
    raise UsageError(f"--into {into!r} is neither a branch nor REMOTE/BRANCH of a configured remote: "
                     "create the branch first or check `git remote -v`")


def build(host: git.Repo, task: Task, head: str, old: str, strategy: str) -> str:
    """The commit that would land on a target now at `old` (objects only, no tree touched)."""
    try:
        meeting = git.merge_base(host, old, head)  # one call answers both questions below
    except GitError as exc:
        raise ApplyRefused(f"the target {old[:12]} and task {task.id} share no history: pick another --into") from exc
    if meeting == head:
        raise ApplyRefused(f"task {task.id}'s commits are already in the target ({old[:12]})")
    fast_forward = meeting == old
    if strategy == "ff":
        if not fast_forward:
            raise ApplyRefused("the target has moved since the task's base, so this is not a fast-forward: "
                               "use --strategy merge or squash")
        return head
    merged = git.merge_tree(host, old, head)
    if merged.tree is None:
        listing = "; ".join(f"{path} ({why})" for path, why in sorted(merged.conflicts.items()))
        raise ApplyRefused(f"applying task {task.id} conflicts in {len(merged.conflicts)} path(s), nothing was "
                           f"changed: {listing}")
    subjects = "".join(f"  {sha[:12]} {subject}\n" for sha, subject in git.commits(host, task.base, head)[:50])
    trailers = f"Ccm-Guard-Task: {task.id}\nCcm-Guard-Base: {task.base}\nCcm-Guard-Head: {head}\n"
    title = "Squash" if strategy == "squash" else "Merge"
    message = f"{title} ccm-guard task {task.id} ({task.branch})\n\n{subjects}\n{trailers}"
    parents = [old] if strategy == "squash" else [old, head]
    return git.commit_tree(host, merged.tree, parents, message, worktree.IDENTITY)


def _apply_local(registry: Registry, task: Task, host: git.Repo, head: str, target: Target,
                 strategy: str, store: StoreCheck) -> Applied:
    for attempt in range(1, MAX_ATTEMPTS + 1):
        old = git.branch_tip(host, target.ref)
        if old is None:
            raise UsageError(f"branch {target.name} does not exist: create it first")
        new = _built(host, task, head, old, strategy, store)
        stats = Later(lambda: git.numstat(host, old, new))  # for the summary, while the checkout is brought along
        intent = {"ref": target.ref, "old": old, "new": new, "strategy": strategy, "pid": os.getpid()}
        moved, checkout = move_target(host, task, target, old, new, f"ccm-guard: apply task {task.id}",
                                      registry=registry, intent=intent, label="apply")
        if moved:
            return _record(registry, task, target, strategy=strategy, old=old, new=new, attempts=attempt,
                           checkout=checkout, stats=stats.result())
        time.sleep(random.uniform(0, 0.02 * attempt))  # let the winner finish
    raise ApplyRefused(f"{target.name} kept moving: gave up after {MAX_ATTEMPTS} attempts; try again")


# A move's record in the task's options, and the status the task must still have to make it.
_CLAIMS = {"apply": ("applying", "COMMITTED"), "rollback": ("rolled_back", "APPLIED")}


def move_target(host: git.Repo, task: Task, target: Target, old: str, new: str, message: str, *,
                registry: Registry, intent: dict[str, Any], label: str) -> tuple[bool, str | None]:
    """Move a local branch old -> new by compare-and-swap, and a checkout of it along.

    The move (`intent`, with this process's pid) is claimed in the registry first (other
    runs then know it is ccm-guard's, and a crash after it is reconciled); ApplyRefused
    where another process has a move of the same task in flight or made one meanwhile.
    The claim is taken back where the move did not happen. Returns (False, None) when
    somebody else moved the branch first, else (True, the checkout brought along or None).
    """
    option, status = _CLAIMS[label]

    def release() -> None:
        registry.drop_option_if(task.id, option, intent)

    common = Path(task.repo)
    checkout = checked_out(host, target.ref, Path(task.main_worktree))
    with _apply_lock(common) if checkout else contextlib.nullcontext():
        if checkout and (found := in_the_way(host, checkout, old, new)):
            raise ApplyRefused(f"{target.name} is checked out in {checkout.work_tree} with files of yours where the "
                               f"{label} puts its own ({found}); nothing was changed: move them aside (git would "
                               f"overwrite an ignored file, or a submodule's checkout), then run the {label} again")
        if not registry.claim_option(task.id, option, intent, status=status):
            raise _claimed_elsewhere(task, label)
        failpoints.point(f"{label}-before-cas")
        if not git.try_update_ref(host, target.ref, new, old, message):
            release()
            return False, None
        failpoints.point(f"{label}-after-cas")
        if checkout:
            _update_checkout(host, checkout, target, old, new, forget=release)
    return True, str(checkout.work_tree) if checkout else None


def _claimed_elsewhere(task: Task, label: str) -> ApplyRefused:
    return ApplyRefused(f"another process is at the {label} of task {task.id}, or has just done it; nothing was "
                        f"changed: `ccm-guard task show {task.id}` says where it stands")


def _apply_remote(registry: Registry, task: Task, host: git.Repo, head: str, target: Target, strategy: str,
                  retries: int, store: StoreCheck) -> Applied:
    branch = target.ref.removeprefix("refs/heads/")
    tracking = f"refs/ccm-guard/push/{task.id}"
    assert target.url is not None
    try:
        rejected = ""
        for attempt in range(1, retries + 1):
            old = git.fetch_ref(host, target.url, branch, tracking)
            if old is None:
                raise UsageError(f"{target.url} has no branch {branch}: create it there first")
            new = _built(host, task, head, old, strategy, store)
            if not registry.claim_option(task.id, "applying", {"ref": target.ref, "url": target.url, "old": old,
                                                                "new": new, "strategy": strategy, "pid": os.getpid()},
                                         status="COMMITTED"):
                raise _claimed_elsewhere(task, "apply")
            push = git.push_ref(host, target.url, new, branch)
            if push is None:
                return _record(registry, task, target, strategy=strategy, old=old, new=new, attempts=attempt,
                               checkout=None, stats=git.numstat(host, old, new))
            rejected = push  # somebody pushed first: fetch, rebuild on their tip, retry
            time.sleep(random.uniform(0, 0.05 * attempt))
        registry.set_option(task.id, "applying", None)
        raise ApplyRefused(f"{target.name} kept moving: the push was rejected {retries} times "
                           f"(last: {rejected}); try again, or raise --retries")
    finally:
        with contextlib.suppress(GitError):
            git.drop_ref(host, tracking)


def _record(registry: Registry, task: Task, target: Target, *, strategy: str, old: str, new: str,
            attempts: int, checkout: str | None, stats: list[git.FileStat]) -> Applied:
    applied = Applied(
        task=task.id, target=target.name, strategy=strategy, old=old, new=new, files=len(stats),
        insertions=sum(s.added or 0 for s in stats), deletions=sum(s.deleted or 0 for s in stats),
        attempts=attempts, checkout=checkout, remote=target.url,
    )
    def record(_: Task, options: dict[str, Any]) -> bool:
        options.pop("applying", None)
        options.pop("rolled_back", None)  # an earlier rollback's record would read as an interrupted one
        options["applied"] = {**applied.to_json(), "ref": target.ref, "at": time.time()}
        return True

    # One transaction: a second apply must never see it COMMITTED and unclaimed.
    registry.edit_options(task.id, record, status="APPLIED")
    return applied


def reconcile(registry: Registry, task: Task) -> str | None:
    """An apply that was killed between moving the target and recording it: finish the record.

    Returns what was found, for `task show` and gc; None when there was nothing to do.
    """
    pending = task.option("applying")
    if not pending or task.status != "COMMITTED" or in_flight(pending):
        return None
    host = layout.host_repo(Path(task.repo))
    if pending.get("url"):
        branch = pending["ref"].removeprefix("refs/heads/")
        tip = git.fetch_ref(host, pending["url"], branch, f"refs/ccm-guard/push/{task.id}")
        with contextlib.suppress(GitError):
            git.drop_ref(host, f"refs/ccm-guard/push/{task.id}")
    else:
        tip = git.resolve_commit(host, pending["ref"])
    landed = tip is not None and (tip == pending["new"] or git.is_ancestor(host, pending["new"], tip))
    if not landed or tip is None:
        registry.set_option(task.id, "applying", None)
        return "an interrupted apply did not land; the target is unchanged"
    target = Target(pending["ref"], pending.get("url"))
    checkout = None if target.url else catch_up_checkout(host, task, target, pending["old"], pending["new"], tip)
    _record(registry, task, target, strategy=pending.get("strategy", "merge"), old=pending["old"], new=pending["new"],
            attempts=1, checkout=checkout[0] if checkout else None,
            stats=git.numstat(host, pending["old"], pending["new"]))
    found = f"an interrupted apply had landed on {target.name} as {pending['new'][:12]}; recorded it as APPLIED"
    return found + (f"; {checkout[1]}" if checkout else "")


def catch_up_checkout(host: git.Repo, task: Task, target: Target, old: str, new: str, tip: str
                      ) -> tuple[str, str] | None:
    """The checkout of the target, if the apply was killed before it was brought along:
    its branch says `new` while its index and files still say `old`, so the person's next
    commit would undo the task's work. Brought up to date as the apply would have
    (read-tree's two-tree merge keeps the person's own changes or refuses)."""
    checkout = checked_out(host, target.ref, Path(task.main_worktree))
    if checkout is None or tip != new:
        return None  # not checked out, or the person has moved on from the apply's commit
    with _apply_lock(Path(host.common_dir)):
        try:
            found = in_the_way(host, checkout, old, new)
            if found:
                raise GitError(f"files of yours are where it puts its own: {found}")
            bring_along(checkout, old, new)
        except GitError as exc:
            return str(checkout.work_tree), (f"{checkout.work_tree} still has the files of before the apply "
                                             f"({exc.message}): run `git -C {checkout.work_tree} read-tree -m -u "
                                             f"{old[:12]} {new[:12]}` once its changes are out of the way")
    return str(checkout.work_tree), f"{checkout.work_tree} was brought up to date with it"


# --- a checked-out target --------------------------------------------------------------------


def checked_out(host: git.Repo, ref: str, main_worktree: Path) -> git.Repo | None:
    """The checkout that has `ref` checked out, if one has. `main_worktree`: where exec
    ran; git names a checkout whose git dir is separate (`git init --separate-git-dir`,
    a submodule's) by its git dir, and only the task's record knows its files."""
    plain = _plain_checkout(host.common_dir, ref, main_worktree)
    if plain is not False:
        return plain
    for entry in git.worktree_list(host):
        if entry.branch == ref and entry.path.is_dir():
            path = entry.path
            listed = os.path.realpath(path)
            if listed == os.path.realpath(host.common_dir):
                path = main_worktree
            found = git.discover(path)
            if os.path.realpath(found.git_dir) != listed and os.path.realpath(found.toplevel) != listed:
                raise RepoError(f"{ref} is checked out in a work tree of {host.common_dir} that ccm-guard cannot "
                                f"find (its git dir is separate): apply with --into another branch, then merge it "
                                "there yourself")
            return found.repo()
    return None


def _plain_checkout(common: Path, ref: str, main_worktree: Path) -> git.Repo | None | Literal[False]:
    """`checked_out` from the files, with no git process, where they say it plainly: None
    when no HEAD of the repository names `ref`; the main checkout at `main_worktree` when
    only its HEAD does and its `.git` is the common dir. False: git's worktree list must say
    (a linked worktree has it, or a HEAD or `.git` that is not a plain file or directory)."""
    want = f"ref: {ref}\n".encode()
    named = []
    for head in [common / "HEAD", *sorted(common.glob("worktrees/*/HEAD"))]:
        data = read_regular(head, 4096)
        if data is None or (data != want and data.split() == want.split()):
            return False  # a link, or the ref spelled otherwise than git writes it
        if data == want:
            named.append(head)
    if not named:
        return None
    dot_git = main_worktree / ".git"
    if named == [common / "HEAD"] and os.path.isdir(dot_git) and not os.path.islink(dot_git) \
            and os.path.samefile(dot_git, common):
        return git.Repo(common, common, main_worktree)
    return False


def in_the_way(host: git.Repo, checkout: git.Repo, old: str, new: str) -> str | None:
    """What of the person's own a move of the checkout from `old` to `new` would overwrite
    or delete although read-tree lets it: git takes ignored files as expendable (read-tree
    and git merge overwrite an ignored .env where the incoming tree has one), and never
    looks inside a submodule it turns into something else. None where nothing is in the way.

    Where the move adds a path (not a submodule: git keeps a directory there), whatever is
    on disk at it, or where it needs a directory, is the person's unless git's index has
    it: git lists what is untracked or ignored there (`ls-files --others`), and what git
    neither tracks nor lists (inside a nested repository) but holds anything is theirs too.
    A submodule the move turns into a file or link must hold nothing."""
    changes = git.tree_changes(host, old, new)
    top = checkout.work_tree
    assert top is not None
    # A submodule whose path, or a directory above it, becomes a file or link: git removes
    # its checkout, the person's work in it included (a plain removal leaves it be).
    files = {c.path for c in changes if c.status in ("A", "T") and c.new_mode != GITLINK}
    replaced = [c.path for c in changes if c.old_mode == GITLINK and c.status in ("D", "T")
                and _under_any(c.path, files) and _holds_anything(top / c.path)]
    candidates = set()
    for change in changes:
        if change.status != "A":
            continue
        parts = change.path.split("/")
        for depth in range(1, len(parts) + 1):
            place = top.joinpath(*parts[:depth])
            puts_file = depth == len(parts) and change.new_mode != GITLINK
            # Where it puts a file, anything; where it needs a directory (or a submodule's,
            # which git keeps), anything but a real directory.
            if os.path.lexists(place) and (puts_file or os.path.islink(place) or not os.path.isdir(place)):
                candidates.add("/".join(parts[:depth]))
                break
    found = [*(f"{p} (a submodule's checkout)" for p in replaced), *_theirs(checkout, top, sorted(candidates))]
    return first_few(found) if found else None


def _theirs(checkout: git.Repo, top: Path, candidates: list[str]) -> list[str]:
    """Of the paths on disk where a move puts its own, those that hold something of the
    person's: listed by git as untracked or ignored, or tracked by nothing and not empty."""
    if not candidates:
        return []
    listed = _with_parents(git.untracked_listed(checkout, candidates))
    tracked = _with_parents(git.tracked_listed(checkout, candidates))
    return [path for path in candidates if path in listed
            or path not in tracked and _holds_anything(top / path, file_counts=True)]


def _with_parents(names: list[str]) -> set[str]:
    """The names and every directory above each: a path is one of them, or holds one, when
    it is in the set (one pass, however many files git lists below the candidates)."""
    found: set[str] = set()
    for name in names:
        while name and name not in found:
            found.add(name)
            name = name.rpartition("/")[0]
    return found


def _under_any(path: str, paths: set[str]) -> bool:
    """Whether `path` or a directory above it is one of `paths`."""
    parts = path.split("/")
    return any("/".join(parts[:depth]) in paths for depth in range(1, len(parts) + 1))


def _holds_anything(place: Path, *, file_counts: bool = False) -> bool:
    """A directory with anything but empty directories in it, or one that cannot be read
    (then no one can say it holds nothing); with `file_counts`, a file or link too."""
    if os.path.islink(place) or os.path.lexists(place) and not os.path.isdir(place):
        return file_counts
    try:
        with os.scandir(place) as listing:
            entries = list(listing)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return any(not e.is_dir(follow_symlinks=False) or _holds_anything(Path(e.path), file_counts=True) for e in entries)


def bring_along(checkout: git.Repo, old: str, new: str) -> None:
    """A checkout at `old` to `new` by a two-tree merge: only what changed is written, the
    person's own changes stay, and one in the way refuses it (GitError). A file whose stat
    data alone changed (touched, saved unchanged) reads as changed until the index is
    refreshed: on that refusal it is, as git merge does first, and the merge tried again."""
    try:
        git.fast_forward_checkout(checkout, old, new)
    except GitError as exc:
        if "not uptodate" not in exc.message:
            raise
        git.refresh_index(checkout)
        git.fast_forward_checkout(checkout, old, new)


def _update_checkout(host: git.Repo, checkout: git.Repo, target: Target, old: str, new: str, *,
                     forget: Callable[[], object]) -> None:
    """The checkout of the target follows its branch: a two-tree merge writes only what the
    apply changed, keeps the person's own changes elsewhere, and refuses, changing nothing,
    where one is in its way (a changed or staged file the apply changes too, an untracked
    file where it puts one): git merge's rule, with no status walk of the tree first. A
    refusal puts the branch back (`forget`: the move's record goes too)."""
    try:
        bring_along(checkout, old, new)
    except GitError as exc:
        # Put the branch back so the checkout's files and its branch agree again.
        if not git.try_update_ref(host, target.ref, old, new, "ccm-guard: apply undone, the checkout refused it"):
            raise ApplyRefused(f"{checkout.work_tree} could not be brought up to date ({exc.message}), and {target.name} "
                               "moved again meanwhile, so it was not put back: `ccm-guard task show` says where "
                               "it stands") from exc
        forget()
        in_way = list(dict.fromkeys(_NAMED_BY_READ_TREE.findall(exc.message)))
        if in_way:
            raise ApplyRefused(f"{target.name} is checked out in {checkout.work_tree} with uncommitted changes in "
                               f"the way ({first_few(in_way)}); the branch was put back, nothing changed: commit or stash them, "
                               "then apply again") from exc
        raise ApplyRefused(f"{checkout.work_tree} could not be brought up to date ({exc.message}); "
                           "the branch was put back, nothing changed: clear the way and apply again") from exc


# read-tree names what is in its way: "Entry 'a' not uptodate", "Untracked working tree file 'b' would be ..."
_NAMED_BY_READ_TREE = re.compile(r"(?:Entry|file) '([^'\n]*)'")


@contextlib.contextmanager
def _apply_lock(common_dir: Path) -> Iterator[None]:
    # Updating a checkout's index is not atomic like a ref: one applier at a time.
    with admin_lock(common_dir, "apply"):
        yield


# --- what an apply would do ------------------------------------------------------------------


