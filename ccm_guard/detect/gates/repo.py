"""The gates over what a run did outside its own tree: refs (refs-untouched), git's
metadata in the common dir and the task's admin dir (git-metadata), and the person's
checkout (main-checkout). Registered, with the others, in gates.GATES.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Collection

from ccm_guard import git
from ccm_guard.detect.context import (
    FAIL,
    WARN,
    Context,
    Finding,
    display,
    git_or_skip,
    plain,
    planted_links,
)
from ccm_guard.detect.delta import FileChange, Owner, RefChange
from ccm_guard.detect.snapshot import PEELED, Entry
from ccm_guard.errors import GitError
from ccm_guard.files import read_regular
from ccm_guard.git import config as configfile
from ccm_guard.state.home import hooks_dir


def refs_untouched(ctx: Context) -> list[Finding]:
    own = ctx.pins.branch_ref
    others = set(ctx.other_tasks.values())
    checked_out = _checked_out_branches(ctx)
    findings = _forged_peels(ctx)
    for rc in ctx.delta.refs:
        if rc.ref.endswith(PEELED):
            continue  # a packed record's peeled line: judged above, by what its ref peels to
        if rc.ref in others and (rc.after is None or plain(rc.after)) and _moved_by_its_task(ctx, rc):
            continue  # another task's branch made, moved or removed by its own run; its gates judge it
        if rc.ref == own and plain(rc.after):
            continue
        if _moved_by_ccm_guard(ctx, rc):  # another task's apply or rollback, recorded in the registry
            if ctx.registry_reachable:
                findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)} by a recorded ccm-guard apply or "
                                        "rollback: unverified, the agent ran without the sandbox and could have "
                                        "written that record", (rc.ref,), WARN))
            continue
        if rc.after is not None and not plain(rc.after):
            findings.append(Finding("refs-untouched", f"{rc.ref} was turned into {rc.after}", (rc.ref,)))
        elif rc.ref.startswith("refs/ccm-guard/") and rc.before is None:
            if rc.ref not in ctx.recorded_refs or ctx.recorded_refs[rc.ref] not in (None, rc.after):
                findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)}, and no ccm-guard run recorded "
                                        "for that task did anything meanwhile (`task restore` and `task rollback "
                                        "--to-snapshot` would take what it names)", (rc.ref,)))
            # else: an archive, snapshot or push record another ccm-guard run wrote
        elif rc.ref == "refs/stash":  # shared by every worktree: the agent's `git stash` lands in yours
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)} (a stash of yours, or the agent's? "
                                    "`git stash list` shows it; a `git stash pop` of the agent's entry applies its "
                                    "changes to your checkout)", (rc.ref,), WARN))
        elif rc.ref.startswith("refs/remotes/"):
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)} (a fetch of yours, or the agent's? "
                                    "a merge or reset to it would take what it now names)", (rc.ref,), WARN))
        elif rc.ref in checked_out and ctx.delta.changed(checked_out[rc.ref]) and not _carries_task_work(ctx, rc):
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)} while its checkout's index changed too: "
                                    "your own commit, or the agent's? check it", (rc.ref,), WARN))
        else:
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)}", (rc.ref,)))
    return findings


def _forged_peels(ctx: Context) -> list[Finding]:
    """packed-refs' peeled lines that the run set: each must be what its ref's object peels
    to (git describe, show-ref -d and what a fetch from here advertises take the line, not
    the tag). One that went is no harm: git then reads the tag itself."""
    changed = [rc for rc in ctx.delta.refs if rc.ref.endswith(PEELED) and rc.after is not None]
    if not changed:
        return []
    tips = {rc.ref: ctx.after.refs.get(rc.ref[:-len(PEELED)]) or "" for rc in changed}
    try:
        truth = git.peeled(ctx.repo, sorted({tip for tip in tips.values() if plain(tip)}))
    except GitError as exc:
        truth, why = {}, f" (it could not be checked: {exc.message})"
    else:
        why = ""
    return [Finding("refs-untouched", f"{rc.ref[:-len(PEELED)]}'s peeled value in packed-refs was set to "
                    f"{(rc.after or '')[:12]}, which is not what it peels to{why}: git describe, show-ref -d and "
                    "whatever serves this repository's refs take that line", (rc.ref,))
            for rc in changed if truth.get(tips[rc.ref]) != rc.after]


def _moved_by_its_task(ctx: Context, rc: RefChange) -> bool:
    """Another task's branch moved by that task's own run or command: its gates judge it.
    A finished task's branch moved by this run is not, and that task's gates will not run
    again. Its own doing shows as that task being at work during this run (the registry),
    or as a commit in its worktree (its index or HEAD reflog moved too). The branch must
    also point where that worktree's HEAD went: its HEAD reflog, which only that
    worktree's git writes (under the sandbox no other task can), holds the new tip (a task
    whose git keeps no HEAD reflog, core.logAllRefUpdates=false, is taken at its word).
    A sibling fork that writes its own commit into the ref file (refs/heads/ccm/ is every
    task's) fails here; one that sets it back to a commit the sibling had is not caught
    (docs/attacks.md, section 4)."""
    for name, branch in ctx.other_tasks.items():
        if branch != rc.ref:
            continue
        prefix = f"common/worktrees/{name}/"
        if not (ctx.delta.changed(prefix + "index") or ctx.delta.changed(prefix + "logs/HEAD")
                or name in ctx.tasks_at_work):
            continue
        if rc.after is None:
            return True  # removed by its discard (recorded moves aside)
        tips = _head_tips(ctx.pins.common_dir / "worktrees" / name / "logs" / "HEAD")
        return tips is None or rc.after in tips
    return False


def _head_tips(reflog: Path) -> list[str] | None:
    """The commits a worktree's HEAD reflog says HEAD went to, oldest first (its last MB);
    None where it keeps none (core.logAllRefUpdates=false): then there is nothing to ask."""
    data = read_regular(reflog, 1 << 20, tail=True)
    if data is None:
        return None
    return [line.split(b" ", 2)[1].decode("ascii", "replace") for line in data.split(b"\n")
            if line.count(b" ") >= 2]


def _moved_by_ccm_guard(ctx: Context, rc: RefChange) -> bool:
    """The ref went from before to after only through recorded ccm-guard moves."""
    edges = {old: new for ref, old, new in ctx.ccm_moves if ref == rc.ref}
    at, seen = rc.before, set()
    while at is not None and at in edges and at not in seen and at != rc.after:
        seen.add(at)
        at = edges[at]
    return at is not None and at == rc.after and bool(seen)


def _carries_task_work(ctx: Context, rc: RefChange) -> bool:
    """The ref now holds the task's own commits: the agent's doing, whatever the index says."""
    head = ctx.head
    if not head or head == ctx.base or not plain(rc.after):
        return False
    try:
        return git.is_ancestor(ctx.repo, head, rc.after or "")
    except GitError:
        return True  # cannot tell: do not excuse it


def _verb(rc: RefChange) -> str:
    if rc.before is None:
        return f"was created at {(rc.after or '')[:12]}"
    if rc.after is None:
        return "was deleted"
    return f"moved {rc.before[:12]} -> {rc.after[:12]}"


def _checked_out_branches(ctx: Context) -> dict[str, str]:
    """Branches checked out in the person's worktrees -> the key of that worktree's index."""
    found = {}
    for key, data in ctx.before.contents.items():
        if not key.endswith("/HEAD") or ctx.ignored_worktree(key):
            continue
        prefix = key[: -len("HEAD")]
        if prefix == f"common/worktrees/{ctx.pins.admin_name}/":
            continue
        if prefix == "common/" or prefix.startswith("common/worktrees/") and prefix.count("/") == 3:
            text = data.decode("utf-8", "replace").strip()
            if text.startswith("ref: "):
                found[text[5:]] = prefix + "index"
    return found


def git_metadata(ctx: Context) -> list[Finding]:
    planted = planted_links(ctx)
    findings = [Finding("git-metadata", f"{len(planted)} link(s) or special file(s) planted in the git metadata, "
                        "which git would write through (ccm-guard ran no git there after this)", tuple(planted))
                ] if planted else []
    guard_hooks = f"host/{hooks_dir(ctx.pins.common_dir)}/"
    stale = set(ctx.finished_pseudorefs)
    for change in ctx.delta.files:
        if ctx.ignored_worktree(change.key):
            found = _other_task_change(ctx, change)
            findings.extend([found] if found else [])
            continue
        rel = change.key[len(guard_hooks):] if change.key.startswith(guard_hooks) else None
        if rel is not None and _other_tasks_hooks(ctx, rel):
            found = _other_hooks_change(ctx, change, rel)
            findings.extend([found] if found else [])
            continue
        where = display(change.key)
        if change.change != "modified" and _is_dir(ctx, change.key) and not _unlisted(ctx, change.key):
            continue  # an empty directory changes nothing; what is put in it is reported
        maintenance = _maintenance(ctx, change.key)
        if maintenance:
            findings.append(Finding("git-metadata", f"{where} was {change.change} ({maintenance})", (where,), WARN))
        elif change.owner is Owner.CONTROL:
            changes = ctx.config_changes.get(change.key, [])
            detail = "; ".join(c.describe() for c in changes)
            benign = bool(changes) and all(c.ccm_guard_setup for c in changes)
            # The person may edit their own global config while a task runs; a key that
            # runs code there fails all the same.
            yours = change.key.startswith("hostconfig/") and not any(c.dangerous for c in changes)
            findings.append(Finding("git-metadata", f"{where} was {change.change}" + (f": {detail}" if detail else "")
                                    + (" (ccm-guard's own setup of another task)" if benign else "")
                                    + (" (your global git config: your change, or the agent's?)" if yours else ""),
                                    (where,), WARN if benign or yours else FAIL))
        elif change.owner is Owner.IN_PROGRESS and change.key in stale:
            findings.append(Finding("git-metadata", f"{where} {change.change}: left by a rebase, revert or cherry-pick "
                                    "that finished (under the sandbox git cannot delete it: that locks packed-refs); "
                                    "ccm-guard removes it", (where,), WARN))
        elif change.owner is Owner.IN_PROGRESS:
            findings.append(Finding("git-metadata", f"{where} {change.change}: an operation was left in progress", (where,)))
        elif change.owner is Owner.OTHER_WORKTREE:
            prefix = "/".join(change.key.split("/")[:3]) + "/"
            found = _state_change(ctx, change, "git-metadata", prefix, "another worktree")
            findings.extend([found] if found else [])
        elif change.owner is Owner.REFLOG and not _is_dir(ctx, change.key) \
                and not _ref_changed(ctx, change.key[len("common/logs/"):]):
            findings.append(Finding("git-metadata", f"reflog {where} was rewritten but its ref did not move", (where,)))
    findings += _locks_left(ctx)
    head = ctx.after.contents.get(f"common/worktrees/{ctx.pins.admin_name}/HEAD", b"").decode("utf-8", "replace").strip()
    if head != f"ref: {ctx.pins.branch_ref}":
        findings.append(Finding("git-metadata", f"the task worktree's HEAD left {ctx.pins.branch}: {head[:60] or '(missing)'}"))
    objs = ctx.delta.objects
    if objs.altered:
        findings.append(Finding("git-metadata", f"{len(objs.altered)} existing object file(s) were rewritten", tuple(objs.altered)))
    if objs.removed:
        findings.append(Finding("git-metadata", f"{len(objs.removed)} existing object file(s) were removed", tuple(objs.removed)))
    if objs.forged:
        findings.append(Finding("git-metadata", f"{len(objs.forged)} new object file(s) do not hold what their "
                                "names say (they could stand in for existing objects)", tuple(objs.forged)))
    if objs.beside_old:
        findings.append(Finding("git-metadata", f"{len(objs.beside_old)} new file(s) beside a pack from before the run "
                                "(a bitmap or reverse index git trusts, a .keep or .promisor gc obeys)",
                                tuple(objs.beside_old)))
    if objs.bitmaps:
        findings.append(Finding("git-metadata", f"{len(objs.bitmaps)} reachability bitmap(s) written (git trusts one "
                                "to list what a push, clone or bundle sends; nothing verifies it)", tuple(objs.bitmaps)))
    if ctx.forged_packs:
        findings.append(Finding("git-metadata", "a new pack or multi-pack index does not verify: its objects "
                                "do not hash to the names it gives them", tuple(ctx.forged_packs)))
    elif objs.repacked:
        findings.append(Finding("git-metadata", f"{len(objs.repacked)} loose object(s) were packed into a new, "
                                "verified pack (git gc)", tuple(objs.new_packs), WARN))
    return findings


def _other_task_change(ctx: Context, change: FileChange) -> Finding | None:
    """Another task's admin dir: that task's own run makes, arms, uses and removes it, and its
    gates judge that. What no run of ccm-guard does is reported here: its control files
    rewritten in place, or its worktree removed while its branch stays and nothing was archived.
    """
    parts = change.key.split("/", 3)
    if len(parts) < 4:
        return None  # the directory itself: what is in it tells
    name, sub = parts[2], parts[3]
    where = display(change.key)
    if change.change == "modified" and change.owner is Owner.CONTROL:
        changes = ctx.config_changes.get(change.key, [])
        if sub == "config.worktree" and _arming(changes, ctx.pins.common_dir / "worktrees" / name):
            return None  # that task being armed or disarmed
        detail = "; ".join(c.describe() for c in changes)
        return Finding("git-metadata", f"{where} was modified" + (f": {detail}" if detail else "")
                       + " (another task's worktree)", (where,))
    if change.change == "removed" and sub == "gitdir":
        branch = ctx.other_tasks[name]
        archived = any(rc.ref == f"refs/ccm-guard/archive/{name}" for rc in ctx.delta.refs)
        if plain(ctx.after.refs.get(branch)) and not archived and name not in ctx.tasks_at_work:
            return Finding("git-metadata", f"another task's worktree ({name}) was removed, but not by ccm-guard: "
                           f"its branch {branch} is still there and nothing was archived", (where,))
    return None


def _locks_left(ctx: Context) -> list[Finding]:
    """Lock files that appeared in the shared git metadata during the run and that no live
    process holds (the agent's are all stopped by now): left behind, every git command of
    the person's that takes that lock fails ("Unable to create '...lock': File exists").
    Other tasks' admin dirs are theirs to judge. While a git of the person's that started
    before the lock works in the repository (one that closed its lock to run a hook or the
    editor), the lock may be its own: then a warning that names that git."""
    from ccm_guard.agent.processes import gits_at_work, held_open

    if ctx.before.format < 2:
        return []  # an older baseline did not record the locks there were
    new = {str(ctx.pins.common_dir / key[len("common/"):]): key for key in set(ctx.after.locks) - set(ctx.before.locks)
           if not ctx.ignored_worktree(key)}
    if not new:
        return []
    times = _unheld(new, held_open)
    if not times:
        return []
    left = tuple(sorted(display(new[path]) for path in times))
    gits = gits_at_work(_work_trees(ctx), started_by=max(times.values()))
    if gits:
        return [Finding("git-metadata", f"{len(left)} lock file(s) appeared in the shared git metadata while a git "
                        f"of yours was at work there ({'; '.join(p.describe() for p in gits[:3])}): its own, or "
                        "left by the agent? (if they stay once that git is done, remove them)", left, WARN)]
    return [Finding("git-metadata", f"{len(left)} lock file(s) left in the shared git metadata that no git "
                    "process holds: your next git command that needs the lock fails (remove them once "
                    "no git is running)", left)]


def _unheld(locks: Collection[str], held_open: Callable[[set[str]], set[str]]) -> dict[str, float]:
    """The lock files (path -> change time) that are there and that no process holds open,
    once they have had a moment to go: git closes a ref's lock before it renames it into
    place, and another task's commit (in a busy machine) can be caught between the two."""
    found: dict[str, float] = {}
    for attempt in range(_LOCK_GRACE_TRIES):
        if attempt:
            time.sleep(_LOCK_GRACE_STEP)
        held = held_open(set(locks))
        found = {path: st.st_ctime for path in locks if path not in held and (st := _lstat(path)) is not None}
        if not found:
            break
        locks = list(found)
    return found


_LOCK_GRACE_TRIES, _LOCK_GRACE_STEP = 6, 0.1


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _work_trees(ctx: Context) -> list[Path]:
    """Where the person's git may run on this repository: the common dir, the main
    checkout and the linked worktrees (each admin dir's `gitdir` names its `.git` file)."""
    found = [ctx.pins.common_dir, *([ctx.main_repo.work_tree] if ctx.main_repo and ctx.main_repo.work_tree else [])]
    for key, data in ctx.after.contents.items():
        parts = key.split("/")
        if len(parts) == 4 and parts[1] == "worktrees" and parts[3] == "gitdir" and parts[2] != ctx.pins.admin_name:
            found.append(Path(data.decode("utf-8", "surrogateescape").strip()).parent)
    return found


def _other_tasks_hooks(ctx: Context, rel: str) -> bool:
    """Whether `rel` (below the repository's guard hooks dir) is not this task's own: the
    hooks another task's worktree runs, or the record of the config arming changed."""
    parts = rel.split("/")
    if parts[0] == "worktree-config.json":
        return True
    return len(parts) > 2 and parts[0] == "worktrees" and parts[1] != ctx.pins.admin_name


def _other_hooks_change(ctx: Context, change: FileChange, rel: str) -> Finding | None:
    """ccm-guard's guard hooks of another task, under the state home: that task's own run
    installs, re-arms and removes them (and each task's arming updates the shared
    worktree-config.json record), and its gates judge that. A hook file added or rewritten
    while no run of that task was at work is code the person's next commit in that
    worktree runs; one removed leaves that worktree unguarded."""
    parts = rel.split("/")
    if ctx.before.format < 2:
        return None  # an older baseline did not record other tasks' hooks
    where = display(change.key)
    if parts[0] == "worktree-config.json":
        # Written only as a task's arming turns extensions.worktreeConfig on (or its
        # removal turns it off): what `uninstall` puts back, so never on its own.
        if ctx.delta.changed("common/config"):
            return None
        return Finding("git-metadata", f"{where} was {change.change} while the repository's config was not "
                       "(the record `ccm-guard uninstall` restores the config from)", (where,))
    if parts[1] in ctx.tasks_at_work:
        return None
    if _is_dir(ctx, change.key):
        return None  # a directory: what is in it tells
    if change.change == "removed":
        return Finding("git-metadata", f"{where} was removed (another task's guard hook, under the state "
                       f"home): that task's worktree is no longer guarded", (where,), WARN)
    return Finding("git-metadata", f"{where} was {change.change} (another task's guard hook, under the state "
                   f"home): the person's next git command in that task's worktree would run it", (where,))


def _arming(changes: list[configfile.ConfigChange], admin: Path) -> bool:
    """Another task's config.worktree changed only as ccm-guard arms or disarms a task: its
    hooks path (under ccm-guard's hooks dir), the person's identity, and (aider) the ignore
    file in that task's own admin dir, each set or unset. Another task's snapshot can fall
    between these writes, so each is judged alone; that task's own gates judge its file."""
    from ccm_guard.state.home import home

    for change in changes:
        values = change.before + change.after
        if change.key == "core.hookspath":
            if not all(v.startswith(str(home() / "hooks") + "/") for v in values):
                return False
        elif change.key == "core.excludesfile":
            if any(v != str(admin / "ccm-guard-excludes") for v in values):
                return False
        elif change.key not in ("user.name", "user.email"):
            return False
    return bool(changes)


def _maintenance(ctx: Context, key: str) -> str | None:
    """What `git gc` rewrites besides packs: lists for dumb transports, and the commit-graph,
    which ccm-guard's own git never reads and which is checked against the commits."""
    if key in ("common/objects/info/packs", "common/info/refs"):
        return "written by git gc / update-server-info"
    if key.startswith("common/objects/info/commit-graph") and ctx.commit_graph_ok:
        return "written by git gc; it verifies against the commits"
    return None


def _unlisted(ctx: Context, key: str) -> bool:
    """A directory too deep for the snapshot to list: what is in it cannot be reported."""
    entry = _entry(ctx, key)
    return entry is not None and entry.digest == "too deep to list"


def _is_dir(ctx: Context, key: str) -> bool:
    entry = _entry(ctx, key)
    return entry is not None and entry.kind == "d"


def _entry(ctx: Context, key: str) -> Entry | None:
    return ctx.after.files.get(key) or ctx.before.files.get(key)


def _ref_changed(ctx: Context, ref: str) -> bool:
    return ref == ctx.pins.branch_ref or ref in ctx.other_tasks.values() or any(rc.ref == ref for rc in ctx.delta.refs)


def _state_change(ctx: Context, change: FileChange, gate: str, prefix: str, place: str) -> Finding | None:
    """A worktree's HEAD or in-progress state changed: the person's doing, or the agent's?

    Every git command that moves HEAD or starts a merge or rebase writes that worktree's
    index too; when the index content stayed the same, it was not a git command.
    """
    where = display(change.key)
    if change.key == prefix + "index":
        return None
    name = change.key[len(prefix):]
    risk = (f" (`git reset --hard {name}` or `git merge {name}` there would take what it now names)"
            if name in ("ORIG_HEAD", "FETCH_HEAD") and change.change != "removed" else "")
    if not ctx.delta.changed(prefix + "index") and (change.key == prefix + "HEAD" or change.change == "added"):
        return Finding(gate, f"{where} {change.change} in {place} while its index did not: not a git command of "
                       f"yours{risk}", (where,))
    return Finding(gate, f"{where} {change.change} in {place}{risk}", (where,), WARN)


def main_checkout(ctx: Context) -> list[Finding]:
    findings = []
    for change in ctx.delta.of(Owner.MAIN):
        found = _state_change(ctx, change, "main-checkout", ctx.delta.main_prefix, "your checkout")
        findings.extend([found] if found else [])
    if ctx.main_files_before is not None and ctx.main_files_after is not None:
        before, after = ctx.main_files_before, ctx.main_files_after
        touched = sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p))
        if touched:
            findings.append(Finding("main-checkout", f"{len(touched)} file(s) in your checkout changed during the run "
                                    "(yours, or the agent's? check them)", tuple(touched), WARN))
    return findings + _flagged_in_main(ctx)


def _flagged_in_main(ctx: Context) -> list[Finding]:
    """Files of the person's checkout flagged assume-unchanged or skip-worktree, when its
    index changed during the run: `git status` (and so the check above) does not look at
    their content, so an edit there would go unseen. Only then: flags need an index write."""
    main = ctx.main_repo
    if main is None or not ctx.delta.changed(ctx.delta.main_prefix + "index"):
        return []
    flagged = git_or_skip(lambda: git.hidden_by_index_flags(main))
    if not flagged:
        return []
    return [Finding("main-checkout", f"{len(flagged)} file(s) of your checkout are flagged assume-unchanged or "
                    "skip-worktree, and its index changed during the run: git status does not show their "
                    "changes (`git ls-files -v` lists them; check them)", tuple(flagged), WARN)]
