"""The hygiene gates: small functions from a run's before/after to findings.

Each has a stable id (its key in GATES), gives a one-line reason and the paths involved
per finding, and is one function and one line in GATES.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from . import configfile, git
from .context import FAIL, WARN, Context, Finding, Skipped, display, git_or_skip, plain
from .delta import FileChange, Owner, RefChange
from .pathcheck import PathChange
from .snapshot import Entry, read_nofollow
from .errors import GitError


def clean_tree(ctx: Context) -> list[Finding]:
    entries = ctx.status()
    findings = _hidden_by_new_ignore_rules(ctx, [e.path for e in entries if e.code == "!!"])
    dirty = [e.path for e in entries if e.code not in ("??", "!!")]
    untracked = [e.path for e in entries if e.code == "??"]
    if dirty:
        findings.append(Finding("clean-tree", f"{len(dirty)} tracked file(s) changed but not committed", tuple(dirty)))
    if untracked:
        findings.append(Finding("clean-tree", f"{len(untracked)} untracked file(s) left behind", tuple(untracked)))
    return findings


def _hidden_by_new_ignore_rules(ctx: Context, ignored: list[str]) -> list[Finding]:
    """Ignored files are build output, unless an ignore file the run changed hides them."""
    rules = git_or_skip(lambda: git.check_ignore(ctx.repo, ignored))
    changed: dict[str, bool] = {}
    hidden: list[str] = []
    culprits: list[str] = []
    for rule in rules:
        if rule.source.startswith("/") or rule.source.startswith(".git/"):
            continue  # info/exclude and friends are git metadata, judged by git-metadata
        if rule.source not in changed:
            changed[rule.source] = git.blob_at(ctx.repo, ctx.base, rule.source) != git.hash_file(ctx.repo, rule.source)
        if changed[rule.source]:
            hidden.append(rule.path)
            culprit = f"{rule.source}:{rule.line} {rule.pattern}"
            culprits += [] if culprit in culprits else [culprit]
    if not hidden:
        return []
    return [Finding("clean-tree", f"{len(hidden)} file(s) hidden by ignore rules this run changed "
                    f"({'; '.join(culprits[:5])})", tuple(hidden))]


def new_commit(ctx: Context) -> list[Finding]:
    head = ctx.head
    if head is None:
        return [Finding("new-commit", f"branch {ctx.pins.branch} is gone or no longer a plain branch", (ctx.pins.branch_ref,))]
    if head == ctx.base:
        return [Finding("new-commit", f"no new commit on {ctx.pins.branch}: the agent must commit its work")]
    if not git_or_skip(lambda: git.is_ancestor(ctx.repo, ctx.base, head)):
        return [Finding("new-commit", f"{ctx.pins.branch} was rewritten: the base {ctx.base[:12]} is no longer in its history")]
    return []


def head_frozen(ctx: Context) -> list[Finding]:
    findings = []
    if ctx.after.refs.get(ctx.pins.branch_ref) != ctx.before.refs.get(ctx.pins.branch_ref):
        findings.append(Finding("head-frozen", f"read-only run moved {ctx.pins.branch}", (ctx.pins.branch_ref,)))
    head_key = f"common/worktrees/{ctx.pins.admin_name}/HEAD"
    if ctx.delta.changed(head_key):
        findings.append(Finding("head-frozen", "read-only run changed the worktree's HEAD", (head_key[7:],)))
    return findings


def refs_untouched(ctx: Context) -> list[Finding]:
    own = ctx.pins.branch_ref
    others = set(ctx.other_tasks.values())
    checked_out = _checked_out_branches(ctx)
    findings = []
    for rc in ctx.delta.refs:
        if rc.ref in others and (rc.after is None or plain(rc.after)) and _moved_by_its_task(ctx, rc.ref):
            continue  # another task's branch made, moved or removed by its own run; its gates judge it
        if rc.ref == own and plain(rc.after):
            continue
        if _moved_by_ccm_guard(ctx, rc):
            continue  # another task's apply or rollback, recorded in the registry
        if rc.after is not None and not plain(rc.after):
            findings.append(Finding("refs-untouched", f"{rc.ref} was turned into {rc.after}", (rc.ref,)))
        elif rc.ref.startswith("refs/ccm-guard/") and rc.before is None:
            continue  # a new archive or snapshot written by another ccm-guard run
        elif rc.ref.startswith(("refs/remotes/", "refs/stash")):
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)} (a fetch or stash of yours?)", (rc.ref,), WARN))
        elif rc.ref in checked_out and ctx.delta.changed(checked_out[rc.ref]) and not _carries_task_work(ctx, rc):
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)} while its checkout's index changed too: "
                                    "your own commit, or the agent's? check it", (rc.ref,), WARN))
        else:
            findings.append(Finding("refs-untouched", f"{rc.ref} {_verb(rc)}", (rc.ref,)))
    return findings


def _moved_by_its_task(ctx: Context, ref: str) -> bool:
    """Another task's branch moved by that task's own run or command: its gates judge it.
    A finished task's branch moved by this run is not, and that task's gates will not run
    again. Its own doing shows as that task being at work during this run (the registry),
    or as a commit in its worktree (its index or HEAD reflog moved too)."""
    for name, branch in ctx.other_tasks.items():
        if branch != ref:
            continue
        prefix = f"common/worktrees/{name}/"
        if ctx.delta.changed(prefix + "index") or ctx.delta.changed(prefix + "logs/HEAD"):
            return True
        if name in ctx.tasks_at_work:
            return True
    return False


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
    findings = []
    for change in ctx.delta.files:
        if ctx.ignored_worktree(change.key):
            found = _other_task_change(ctx, change)
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
        elif change.owner is Owner.IN_PROGRESS:
            findings.append(Finding("git-metadata", f"{where} {change.change}: an operation was left in progress", (where,)))
        elif change.owner is Owner.OTHER_WORKTREE:
            prefix = "/".join(change.key.split("/")[:3]) + "/"
            found = _state_change(ctx, change, "git-metadata", prefix, "another worktree")
            findings.extend([found] if found else [])
        elif change.owner is Owner.REFLOG and not _is_dir(ctx, change.key) \
                and not _ref_changed(ctx, change.key[len("common/logs/"):]):
            findings.append(Finding("git-metadata", f"reflog {where} was rewritten but its ref did not move", (where,)))
    head = ctx.after.contents.get(f"common/worktrees/{ctx.pins.admin_name}/HEAD", b"").decode("utf-8", "replace").strip()
    if head != f"ref: {ctx.pins.branch_ref}":
        findings.append(Finding("git-metadata", f"the task worktree's HEAD left {ctx.pins.branch}: {head[:60] or '(missing)'}"))
    objs = ctx.delta.objects
    if objs.altered:
        findings.append(Finding("git-metadata", f"{len(objs.altered)} existing object file(s) were rewritten", tuple(objs.altered)))
    if objs.removed:
        findings.append(Finding("git-metadata", f"{len(objs.removed)} existing object file(s) were removed", tuple(objs.removed)))
    if ctx.forged_packs:
        findings.append(Finding("git-metadata", "a new pack took existing objects but does not verify",
                                tuple(ctx.forged_packs)))
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
        if sub == "config.worktree" and changes and all(_hooks_setup(c) for c in changes):
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


def _hooks_setup(change: configfile.ConfigChange) -> bool:
    """ccm-guard's own per-task hooks path, set when a task is armed and unset when disarmed."""
    from .registry import home

    ours = str(home() / "hooks") + "/"
    return change.key == "core.hookspath" and all(v.startswith(ours) for v in change.before + change.after)


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
    if not ctx.delta.changed(prefix + "index") and (change.key == prefix + "HEAD" or change.change == "added"):
        return Finding(gate, f"{where} {change.change} in {place} while its index did not: not a git command of yours",
                       (where,))
    return Finding(gate, f"{where} {change.change} in {place}", (where,), WARN)


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
    return findings


def path_policy(ctx: Context) -> list[Finding]:
    """Every changed path against the role's allow/forbid rules, symlinks, gitlinks, twins."""
    if ctx.role is None:
        return []
    from .pathcheck import check, link_targets
    from .pathrules import Rules

    changes = git_or_skip(lambda: ctx.path_changes)
    if not changes:
        return []
    target = git_or_skip(lambda: link_targets(ctx.repo, changes, ctx.pins.worktree))

    def final_paths() -> list[str]:
        tracked = git.tree_paths(ctx.repo, ctx.head) if ctx.head else []
        return tracked + [c.path for c in changes if c.status == "?"]

    rules = Rules(ctx.role.allow, ctx.role.forbid)
    return [Finding("path-policy", f"{v.path}: {v.reason} ({v.where})", (v.path,), v.severity)
            for v in check(changes, rules, target, final_paths)] + _policy_table_edits(ctx, changes) \
        + host_code(changes)


def _policy_table_edits(ctx: Context, changes: list[PathChange]) -> list[Finding]:
    """pyproject.toml may be the agent's to change, but its [tool.ccm-guard] table is the
    repository's policy (the next run's rules): changing that is changing the policy."""
    if not any(c.path == "pyproject.toml" for c in changes):
        return []
    from .policy import POLICY_TABLE_FILE, policy_table

    before = policy_table(git.file_at(ctx.repo, ctx.base, POLICY_TABLE_FILE))
    versions = [("committed", git.file_at(ctx.repo, ctx.head, POLICY_TABLE_FILE) if ctx.head else None),
                ("in the work tree", read_nofollow(ctx.pins.worktree / POLICY_TABLE_FILE))]
    for where, data in versions:
        if policy_table(data) != before:
            return [Finding("path-policy", f"{POLICY_TABLE_FILE}: its [tool.ccm-guard] table, the repository's policy, "
                            f"was changed ({where}); only the person changes the policy", (POLICY_TABLE_FILE,))]
    return []


def limits(ctx: Context) -> list[Finding]:
    """The role's limits: the largest file, bytes added, files changed, commits made."""
    if ctx.role is None:
        return []
    from .pathcheck import measure

    lim = ctx.role.limits
    head = ctx.head
    commits = len(git_or_skip(lambda: git.commits(ctx.repo, ctx.base, head))) if head and head != ctx.base else 0
    fig = git_or_skip(lambda: measure(ctx.path_changes, commits, ctx.repo, ctx.pins.worktree))
    checks = [
        (lim.max_file_bytes, fig.largest[0], f"the largest file, {fig.largest[1]!r}, has {fig.largest[0]} bytes",
         (fig.largest[1],)),
        (lim.max_added_bytes, fig.added_bytes, f"the run added {fig.added_bytes} bytes", ()),
        (lim.max_files, fig.files, f"the run changed {fig.files} files", ()),
        (lim.max_commits, fig.commits, f"the run made {fig.commits} commits", ()),
    ]
    return [Finding("limits", f"{what}; the limit is {limit}", paths)
            for limit, value, what, paths in checks if limit is not None and value > limit]


# Project files that tools run by themselves, or that the person is likely to run, once
# the work is merged: CI, hook managers, direnv, editors' tasks, test and build runners.
# A role may allow them (an implementor may fix CI); the reviewer is told all the same.
_RUN_BY_NAME = frozenset({
    ".envrc", ".pre-commit-config.yaml", ".pre-commit-hooks.yaml", "lefthook.yml", ".lefthook.yml",
    "conftest.py", "sitecustomize.py", "usercustomize.py", "setup.py", "noxfile.py", "tox.ini",
    "pytest.ini", "Makefile", "makefile", "GNUmakefile", "build.rs", "package.json", ".npmrc",
    ".yarnrc", ".yarnrc.yml", "Rakefile", "Jenkinsfile", ".gitlab-ci.yml", ".travis.yml",
    "azure-pipelines.yml", "justfile", "Taskfile.yml",
})
_RUN_BY_DIR = (".github/workflows/", ".circleci/", ".husky/", ".githooks/", ".vscode/", ".idea/", ".cargo/",
               ".devcontainer/", ".ci/", ".buildkite/")


def host_code(changes: list[PathChange]) -> list[Finding]:
    """Part of path-policy: executable project content (warned, whatever the role allows), and
    git repositories smuggled in as plain files (failed: git run inside one obeys its config)."""
    paths = sorted({c.path for c in changes if c.status != "D"})
    runs = [p for p in paths if p.rsplit("/", 1)[-1] in _RUN_BY_NAME or p.endswith(".pth")
            or any(p.startswith(d) or f"/{d}" in p for d in _RUN_BY_DIR)]
    findings = []
    repos = _embedded_repositories(paths)
    if repos:
        findings.append(Finding("path-policy", f"{len(repos)} git repositor{'y' if len(repos) == 1 else 'ies'} "
                                "added as plain files: git run inside one runs its config's programs", tuple(repos)))
    if runs:
        findings.append(Finding("path-policy", f"{len(runs)} file(s) that tools run by themselves (CI, hooks, direnv, "
                                "test or build runners) changed: review them before running anything", tuple(runs), WARN))
    return findings


def _embedded_repositories(paths: list[str]) -> list[str]:
    """Directories that git would take for a repository: HEAD beside objects/ and refs/."""
    present = set(paths)
    found = []
    for path in paths:
        if path.rsplit("/", 1)[-1] != "HEAD":
            continue
        top = path[: -len("HEAD")]
        if any(p.startswith(top + "objects/") for p in present) and any(p.startswith(top + "refs/") for p in present):
            found.append(top.rstrip("/") or ".")
    return found


def processes(ctx: Context) -> list[Finding]:
    if not ctx.leftovers:
        return []
    return [Finding("processes", f"{len(ctx.leftovers)} process(es) the agent started were still running and were killed",
                    ctx.leftovers)]


Gate = Callable[[Context], list[Finding]]
GATES: dict[str, Gate] = {
    "processes": processes,
    "git-metadata": git_metadata,
    "refs-untouched": refs_untouched,
    "main-checkout": main_checkout,
    "new-commit": new_commit,
    "head-frozen": head_frozen,
    "path-policy": path_policy,
    "limits": limits,
    "clean-tree": clean_tree,
}


def select(read_only: bool, require_commit: bool, with_policy: bool = True) -> list[str]:
    """The gates a run's role and options ask for, in the order they are reported."""
    names = ["processes", "git-metadata", "refs-untouched", "main-checkout"]
    if read_only:
        names.append("head-frozen")
    elif require_commit:
        names.append("new-commit")
    if with_policy:
        names += ["path-policy", "limits"]
    names.append("clean-tree")
    return names


@dataclasses.dataclass(frozen=True)
class GateResult:
    name: str
    status: str  # "pass", "fail", "warn", "skipped"
    findings: tuple[Finding, ...]
    note: str = ""

    @classmethod
    def of(cls, name: str, findings: list[Finding]) -> "GateResult":
        """Fail on any failing finding, warn on any other, else pass."""
        status = "fail" if any(f.severity == FAIL for f in findings) else "warn" if findings else "pass"
        return cls(name, status, tuple(findings))


def run_gates(ctx: Context, names: list[str]) -> list[GateResult]:
    results = []
    for name in names:
        try:
            findings = GATES[name](ctx)
        except Skipped as exc:
            results.append(GateResult(name, "skipped", (), str(exc)))
            continue
        except GitError as exc:  # a repository broken by the agent must still get a verdict
            findings = [Finding(name, f"git failed, so this gate could not judge: {exc.message}")]
        results.append(GateResult.of(name, findings))
    return results
