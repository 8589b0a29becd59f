"""Judging a run in a copied directory: the gates that make sense without git.

processes, source-untouched, path-policy, symlinks, limits, and `unchanged` for a
read-only run, each over the copy compared with its manifest (and the original compared
with it too: the person, or an unsandboxed agent, may have written there). The git-only
gates are named in the verdict as not run.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Mapping

from ccm_guard.copy.tree import (
    STRATEGY,
    Change,
    Item,
    diff,
    file_changes,
    line_stats,
    manifest_hash,
    observe,
)
from ccm_guard.detect.context import WARN, Finding
from ccm_guard.detect.gates import GateResult
from ccm_guard.detect.verdict import Checks, Verdict
from ccm_guard.git import FileStat
from ccm_guard.pathrules.check import MISSING, PathChange
from ccm_guard.state.registry import Task

BRANCH = "(copy)"  # a copied directory has no branch; the registry's column is not null
NOT_RUN = ("git-metadata", "refs-untouched", "main-checkout", "new-commit", "clean-tree")


@dataclasses.dataclass
class CopyVerdict(Verdict):
    """A Verdict that says it is the copied-directory fallback and what was not judged."""

    strategy: str = STRATEGY
    not_run: list[str] = dataclasses.field(default_factory=list)  # the git-only gates


@dataclasses.dataclass(frozen=True)
class CopyRun:
    """What the copy gates see."""

    source: Path
    copy: Path
    base: Mapping[str, Item]
    after: Mapping[str, Item]
    changes: list[Change]  # in the copy, against the manifest
    source_changes: list[Change]  # in the original, during the run
    source_unreadable: list[str]  # directories of the original that could not be listed
    checks: Checks
    leftovers: tuple[str, ...]
    sandboxed: bool


def judge_copy(task: Task, base: Mapping[str, Item], checks: Checks, leftovers: tuple[str, ...] = (),
               sandboxed: bool = False) -> CopyVerdict:
    source, copy = Path(task.main_worktree), Path(task.worktree)
    hidden: list[str] = []
    after = observe(copy, base, "copy", hidden)
    source_unreadable: list[str] = []
    source_changes = diff(base, observe(source, base, "src", source_unreadable), copied_only=False)
    run = CopyRun(source, copy, base, after, diff(base, after), source_changes, source_unreadable, checks,
                  leftovers, sandboxed)
    names = ["processes", "source-untouched", *(["unchanged"] if checks.read_only else []),
             "path-policy", "symlinks", "limits"]
    results = [_run_gate(name, run) for name in names]
    skipped_git = [n if n != "new-commit" or not checks.read_only else "head-frozen" for n in NOT_RUN]
    notes = [f"{source} is in no git repository: the agent worked in a copy of it ({copy}), "
             "the copied-directory fallback",
             f"not run, as they need git: {', '.join(skipped_git)}"]
    errors = [f"could not list {len(hidden)} director(ies) in the copy, so the run cannot be judged or "
              f"applied: {', '.join(hidden[:5])}"] if hidden else []
    return CopyVerdict(
        task=task.id, branch=BRANCH, base=task.base, head=manifest_hash(after), repo=str(source),
        worktree=str(copy), log_dir=task.log_dir, agent=None, commits=[], files=file_stats(run),
        gates=results, disposition="kept", errors=errors,
        not_run=skipped_git, notes=notes,
    )


def _run_gate(name: str, run: CopyRun) -> GateResult:
    try:
        findings = COPY_GATES[name](run)
    except OSError as exc:  # a tree the agent left unreadable must still get a verdict
        findings = [Finding(name, f"could not judge: {exc.strerror or exc} ({exc.filename})")]
    return GateResult.of(name, findings)


def gate_processes(run: CopyRun) -> list[Finding]:
    if not run.leftovers:
        return []
    return [Finding("processes", f"{len(run.leftovers)} process(es) the agent started were still running "
                    "and were killed", run.leftovers)]


def gate_source_untouched(run: CopyRun) -> list[Finding]:
    """The original changed while the agent ran: the person's edits, or the agent writing
    outside its copy. Without a sandbox they cannot be told apart, so this warns (as the
    git strategy's main-checkout gate does); `apply` refuses any path both changed."""
    found = []
    if run.source_unreadable:
        found.append(Finding("source-untouched", f"{len(run.source_unreadable)} director(ies) of {run.source} can "
                             "no longer be listed", tuple(run.source_unreadable)))
    if not run.source_changes:
        return found
    who = ("not the agent's: the sandbox kept it out" if run.sandboxed
           else "yours, or the agent's? check them; --sandbox landlock keeps the agent out")
    return found + [Finding("source-untouched", f"{len(run.source_changes)} path(s) in {run.source} changed "
                            f"during the run ({who})", tuple(c.path for c in run.source_changes), WARN)]


def gate_unchanged(run: CopyRun) -> list[Finding]:
    if not run.changes:
        return []
    return [Finding("unchanged", f"a read-only run changed {len(run.changes)} path(s) in its copy",
                    tuple(c.path for c in run.changes))]


def _path_changes(run: CopyRun) -> list[PathChange]:
    """The copy's changes as the git strategy's path checks see a work tree's."""
    def mode(item: Item | None) -> str:
        if item is None or item.kind == "d":
            return MISSING
        if item.kind == "l":
            return "120000"
        return "100755" if item.mode & 0o111 else "100644"

    return [PathChange(c.path, c.status, mode(c.before), mode(c.after), None, None, "in the copy")
            for c in file_changes(run.changes)]


def gate_path_policy(run: CopyRun) -> list[Finding]:
    """The role's rules on every changed path, as the git strategy checks its work tree."""
    role = run.checks.role
    changes = _path_changes(run)
    if role is None or not changes:
        return []
    from ccm_guard.pathrules.check import check
    from ccm_guard.pathrules.rules import (
        Rules,  # pathspec's import costs ~50 ms: only when there are paths
    )

    targets = {c.path: c.after.digest for c in run.changes if c.after is not None and c.after.kind == "l"}
    finals = [p for p, i in run.after.items() if i.kind in ("f", "l")]
    found = check(changes, Rules(role.allow, role.forbid), lambda c: targets.get(c.path), lambda: finals)
    return [Finding("path-policy", f"{v.path}: {v.reason} ({v.where})", (v.path,), v.severity) for v in found]


def gate_symlinks(run: CopyRun) -> list[Finding]:
    """A new or changed symlink that resolves outside the copy, through other links too
    (`z -> ext/file` where `ext` is the person's link to /opt). One that points outside
    by its own text is path-policy's finding already."""
    root = os.path.realpath(run.copy)
    found = []
    for c in run.changes:
        if c.after is None or c.after.kind != "l":
            continue
        target = c.after.digest or ""
        lexical = os.path.normpath(os.path.join(os.path.dirname(c.path), target))
        if os.path.isabs(target) or lexical == ".." or lexical.startswith("../"):
            continue
        real = os.path.realpath(run.copy / c.path)
        if real != root and not real.startswith(root + "/"):
            found.append(Finding("symlinks", f"{c.path} resolves outside the copy, to {real}", (c.path,)))
    return found


def gate_limits(run: CopyRun) -> list[Finding]:
    role = run.checks.role
    if role is None:
        return []
    lim = role.limits
    files = file_changes(run.changes)
    sizes = [(c.after.size, c.path) for c in files if c.after is not None and c.after.kind == "f"]
    largest = max(sizes, default=(0, ""))
    growth = sum(max(0, (c.after.size if c.after else 0) - (c.before.size if c.before else 0)) for c in files)
    checks = [
        (lim.max_file_bytes, largest[0], f"the largest file, {largest[1]!r}, has {largest[0]} bytes", (largest[1],)),
        (lim.max_added_bytes, growth, f"the run added {growth} bytes", ()),
        (lim.max_files, len(files), f"the run changed {len(files)} files", ()),
    ]
    return [Finding("limits", f"{what}; the limit is {limit}", paths)
            for limit, value, what, paths in checks if limit is not None and value > limit]


COPY_GATES: dict[str, Callable[[CopyRun], list[Finding]]] = {
    "processes": gate_processes,
    "source-untouched": gate_source_untouched,
    "unchanged": gate_unchanged,
    "path-policy": gate_path_policy,
    "symlinks": gate_symlinks,
    "limits": gate_limits,
}


def file_stats(run: CopyRun) -> list[FileStat]:
    """Lines added and deleted per changed file. The old side is the original's file while
    it is still as the copy started (it is gone from the copy); else there are no counts."""
    files = file_changes(run.changes)
    counts = line_stats(files, run.source, run.copy, {c.path for c in run.source_changes})
    return [FileStat(c.path, *counts[c.path]) for c in files]
