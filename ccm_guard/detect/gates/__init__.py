"""The hygiene gates: small functions from a run's before/after to findings.

Each has a stable id (its key in GATES), gives a one-line reason and the paths involved
per finding, and is one function and one line in GATES. Here: the task's own tree,
commits, paths, limits and processes; refs, git metadata and the person's checkout are
in gates/repo.py.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ccm_guard import git
from ccm_guard.detect.context import (
    FAIL,
    WARN,
    Context,
    Finding,
    Skipped,
    git_or_skip,
)
from ccm_guard.detect.gates.repo import git_metadata, main_checkout, refs_untouched
from ccm_guard.errors import GitError
from ccm_guard.files import read_regular
from ccm_guard.pathrules.check import PathChange

if TYPE_CHECKING:
    from ccm_guard.detect.paths import Figures
    from ccm_guard.policy import Limits, Role


def clean_tree(ctx: Context) -> list[Finding]:
    entries = ctx.left()  # what setup left, untouched since, is where the agent started
    findings = _hidden_by_new_ignore_rules(ctx, [e.path for e in entries if e.code == "!!"])
    dirty = [e.path for e in entries if e.code not in ("??", "!!")]
    untracked = [e.path for e in entries if e.code == "??"]
    if dirty:
        findings.append(Finding("clean-tree", f"{len(dirty)} tracked file(s) changed but not committed", tuple(dirty)))
    if untracked:
        findings.append(Finding("clean-tree", f"{len(untracked)} untracked file(s) left behind", tuple(untracked)))
    # The work tree was read against ccm-guard's own index, which has no such flags: an edit
    # they hide from the task's git shows above. Where something does, they may explain it.
    flagged = git_or_skip(lambda: git.hidden_by_index_flags(ctx.repo)) if dirty or untracked else []
    if flagged:
        findings.append(Finding("clean-tree", f"{len(flagged)} tracked file(s) flagged assume-unchanged or "
                                "skip-worktree in the index: git status does not see their changes", tuple(flagged)))
    stashed = git_or_skip(lambda: git.worktree_stash(ctx.repo))
    if stashed:
        findings.append(Finding("clean-tree", f"{len(stashed)} stash entr{'y' if len(stashed) == 1 else 'ies'} left on "
                                "the worktree's own stash (git stash list there): not in the task's commits; "
                                "discarding the task keeps them in its archive", (), "warn"))
    return findings


# Tools that keep a cache directory which ignores itself (a `.gitignore` of `*` inside it):
# pytest, mypy and ruff. Nothing runs from them, pytest does not look inside them, and an
# agent that runs the tests makes one.
# (Not a virtualenv, though uv's ignores itself too: what is in it runs when it is used.)
_SELF_IGNORING = frozenset((".pytest_cache", ".mypy_cache", ".ruff_cache"))


def _tool_cache(ctx: Context, rule: git.IgnoreRule, untracked: dict[str, bool]) -> bool:
    """A rule that is a tool's self-ignoring cache directory ignoring itself: `*` in an
    untracked `<cache>/.gitignore`, for a path in that directory. (`untracked`: the answer
    by ignore file, asked once each.)"""
    directory, _, name = rule.source.rpartition("/")
    if name != ".gitignore" or directory.rpartition("/")[2] not in _SELF_IGNORING or rule.pattern != "*" \
            or not rule.path.startswith(directory + "/"):
        return False
    if rule.source not in untracked:
        untracked[rule.source] = all(git.blob_at(ctx.repo, rev, rule.source) is None
                                     for rev in {ctx.base, ctx.head or ctx.base})
    return untracked[rule.source]


def _hidden_by_new_ignore_rules(ctx: Context, ignored: list[str]) -> list[Finding]:
    """Ignored files are build output, unless an ignore file the run changed hides them."""
    rules = git_or_skip(lambda: git.check_ignore(ctx.repo, ignored))
    changed: dict[str, bool] = {}
    hidden: list[str] = []
    culprits: list[str] = []
    caches: dict[str, bool] = {}
    for rule in rules:
        if rule.source.startswith("/") or rule.source.startswith(".git/"):
            continue  # info/exclude and friends are git metadata, judged by git-metadata
        if _tool_cache(ctx, rule, caches):
            continue
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
    return forged_claims(ctx.repo, ctx.base, head, made_by_us=ctx.ccm_commits)


# What only ccm-guard writes into a commit: its trailers (a recovery's reason, an apply's
# task, base and head, a rollback's revert) and its identity.
CCM_TRAILERS = ("recovery-reason:", "ccm-guard-")
CCM_EMAIL = "ccm-guard@localhost"


def forged_claims(repo: git.Repo, base: str, head: str, *, made_by_us: tuple[str, ...] = (),
                  severity: str = FAIL) -> list[Finding]:
    """Commits of base..head that claim to be ccm-guard's (`made_by_us`: the ones that are): a
    reviewer would trust them. `severity`: WARN where the claim cannot be checked."""
    forged = []
    for sha, author, committer, trailers in git_or_skip(lambda: git.commit_claims(repo, base, head)):
        if sha in made_by_us:
            continue
        ours = [t.split(":", 1)[0] for t in trailers if t.lower().startswith(CCM_TRAILERS)]
        if ours or CCM_EMAIL in (author, committer):
            what = ", ".join(dict.fromkeys(ours)) or f"the identity {CCM_EMAIL}"
            forged.append(Finding("new-commit", f"commit {sha[:12]} claims to be ccm-guard's ({what}), "
                                  + ("which only ccm-guard writes" if severity == FAIL else
                                     "and no record here proves it: review it as the agent's"), (sha,), severity))
    return forged


def head_frozen(ctx: Context) -> list[Finding]:
    findings = []
    if ctx.after.refs.get(ctx.pins.branch_ref) != ctx.before.refs.get(ctx.pins.branch_ref):
        findings.append(Finding("head-frozen", f"read-only run moved {ctx.pins.branch}", (ctx.pins.branch_ref,)))
    head_key = f"common/worktrees/{ctx.pins.admin_name}/HEAD"
    if ctx.delta.changed(head_key):
        findings.append(Finding("head-frozen", "read-only run changed the worktree's HEAD", (head_key[7:],)))
    return findings


def path_policy(ctx: Context) -> list[Finding]:
    """Every changed path against the role's allow/forbid rules, symlinks, gitlinks, twins."""
    if ctx.role is None:
        return []
    from ccm_guard.detect.paths import link_targets
    from ccm_guard.pathrules.check import check
    from ccm_guard.pathrules.rules import Rules

    changes = git_or_skip(lambda: ctx.path_changes)
    if not changes:
        return []
    target = link_targets(ctx.repo, changes, ctx.pins.worktree)  # (reads the links' blobs when check asks)

    def final_paths() -> list[str]:
        tracked = git.tree_paths(ctx.repo, ctx.head) if ctx.head else []
        return tracked + [c.path for c in changes if c.status == "?"]

    rules = Rules(ctx.role.allow, ctx.role.forbid)
    return [Finding("path-policy", f"{v.path}: {v.reason} ({v.where})", (v.path,), v.severity)
            for v in check(changes, rules, target, final_paths)] \
        + policy_table_edits(ctx.repo, ctx.base, ctx.head, changes, worktree=ctx.pins.worktree) \
        + host_code(changes, ctx.role, config_steered(ctx.pins.common_dir, _main_top(ctx)))


def _main_top(ctx: Context) -> Path | None:
    if ctx.main_repo is not None and ctx.main_repo.work_tree is not None:
        return ctx.main_repo.work_tree
    common = ctx.pins.common_dir
    return common.parent if common.name == ".git" else None


def config_steered(common: Path, top: Path | None) -> tuple[str, ...]:
    """Tree paths that the repository's config (and the global config, and what they
    include) has git run or read as config, so that a change to them runs code in the
    person's next git command once merged: the `core.hooksPath` directory when it lies in
    the work tree ("dir/"), `.git/hooks` or a hook in it that is a link into the tree, and
    config files included from the tree. Each as written and as its links resolve: an
    agent may change the link on the way as well as what it leads to."""
    try:
        return tuple(dict.fromkeys(_steered(common, top)))
    except (OSError, GitError):  # whatever cannot be read here is judged by git-metadata
        return ()


def _steered(common: Path, top: Path | None) -> list[str]:
    from ccm_guard.git.config import global_config_files, hooks_paths, include_targets

    if top is None:
        return []
    top_abs, top_real = os.path.abspath(top), os.path.realpath(top)

    def in_tree(path: str, folder: bool = False) -> list[str]:
        """`path` relative to the tree, as written and as resolved (when inside it)."""
        found = []
        for base, where in ((top_abs, os.path.normpath(path)), (top_real, os.path.realpath(path))):
            rel = os.path.relpath(where, base)
            if rel != ".." and not rel.startswith("../"):
                found.append("" if rel == "." else rel + "/" if folder else rel)
        return found

    found: list[str] = []
    queue = [common / "config", common / "config.worktree", *global_config_files()]
    seen: set[Path] = set()
    while queue and len(seen) < 64:  # include cycles; a bound on what an agent can make us read
        config = queue.pop(0)
        if config in seen:
            continue
        seen.add(config)
        data = read_regular(Path(os.path.realpath(config)), 1 << 20)
        if not data:
            continue
        for value in hooks_paths(data):
            # Relative: to the top of the work tree git runs in (any worktree of this tree).
            found += in_tree(value if os.path.isabs(value) else os.path.join(top_abs, value), folder=True)
        for target in include_targets(config, data):
            found += in_tree(str(target))
            queue.append(target)
    hooks = common / "hooks"
    if hooks.is_symlink():
        found += in_tree(os.path.join(common, os.readlink(hooks)), folder=True)
    elif hooks.is_dir():
        for hook in os.scandir(hooks):
            if hook.is_symlink():
                found += in_tree(os.path.join(hooks, os.readlink(hook.path)))
    return [f for f in found if f]  # "" (the whole tree as a hooks dir) names no one path


def _steers(path: str, steered: tuple[str, ...]) -> bool:
    """`path` is a steered path, lies in a steered directory, or is a directory (or a link
    put in its place) on the way to one (both casefolded)."""
    return any(path == s.rstrip("/") or (s.endswith("/") and path.startswith(s)) or s.startswith(path + "/")
               for s in steered)


def policy_table_edits(repo: git.Repo, base: str, head: str | None, changes: list[PathChange], *,
                       worktree: Path | None) -> list[Finding]:
    """pyproject.toml may be the agent's to change, but its [tool.ccm-guard] table is the
    repository's policy (the next run's rules): changing that is changing the policy.
    `worktree`: where uncommitted work may be too (None for a range of commits)."""
    if not any(c.path == "pyproject.toml" for c in changes):
        return []
    from ccm_guard.policy import POLICY_TABLE_FILE, policy_table

    before = policy_table(git.file_at(repo, base, POLICY_TABLE_FILE))
    versions = [("committed", git.file_at(repo, head, POLICY_TABLE_FILE) if head else None)]
    if worktree is not None:
        # Bounded: the agent chose this file's size (a larger one is cut, fails to parse, and shows as an edit).
        versions.append(("in the work tree", read_regular(worktree / POLICY_TABLE_FILE, 1 << 24)))
    for where, data in versions:
        if policy_table(data) != before:
            return [Finding("path-policy", f"{POLICY_TABLE_FILE}: its [tool.ccm-guard] table, the repository's policy, "
                            f"was changed ({where}); only the person changes the policy", (POLICY_TABLE_FILE,))]
    return []


def limits(ctx: Context) -> list[Finding]:
    """The role's limits: the largest file, bytes added, files changed, commits made."""
    if ctx.role is None:
        return []
    from ccm_guard.detect.paths import measure

    head = ctx.head
    commits = len(git_or_skip(lambda: git.commits(ctx.repo, ctx.base, head))) if head and head != ctx.base else 0
    fig = git_or_skip(lambda: measure(ctx.path_changes, commits, ctx.repo, ctx.pins.worktree))
    return limit_findings(ctx.role.limits, fig)


def limit_findings(lim: Limits, fig: Figures) -> list[Finding]:
    """The figures of a run (or a range of commits) against a role's limits."""
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
# the work is merged, by where a tool looks for them. Whatever the role's `allow` admits:
# - CI and git-hook managers run them on other machines or on the person's next commit: a
#   change fails unless the role says `ci_files = "warn"`;
# - direnv, editors' run configs and the next agent's instructions and settings are obeyed
#   as soon as the person opens the directory: a change fails for a role with an `allow`
#   list (a docs-writer's "*.md" must not admit AGENTS.md) and is a warning for the others,
#   unless the role says `run_files`;
# - test and build runners are run on purpose (like the tests themselves): a warning.
_CI_BY_NAME = frozenset({".pre-commit-config.yaml", ".pre-commit-hooks.yaml", "lefthook.yml", ".lefthook.yml",
                         "Jenkinsfile", ".gitlab-ci.yml", ".travis.yml", "azure-pipelines.yml"})
_CI_BY_DIR = (".github/workflows/", ".github/actions/", ".circleci/", ".husky/", ".githooks/", ".buildkite/")
_OBEYED_BY_NAME = frozenset({".envrc", ".mcp.json", "AGENTS.md", "AGENTS.override.md", "CLAUDE.md", "CLAUDE.local.md",
                             "GEMINI.md", ".cursorrules", ".windsurfrules", ".clinerules", ".aider.conf.yml",
                             ".devcontainer.json", "copilot-instructions.md", "AGENT.md",
                             ".goosehints", ".roorules"})
_OBEYED_BY_DIR = (".vscode/", ".idea/", ".devcontainer/", ".claude/", ".codex/", ".gemini/", ".cursor/", ".windsurf/",
                  ".clinerules/", ".github/instructions/", ".github/prompts/", ".kiro/", ".roo/", ".amazonq/")
_RUN_BY_NAME = frozenset({
    "conftest.py", "sitecustomize.py", "usercustomize.py", "setup.py", "noxfile.py", "tox.ini",
    "pytest.ini", "Makefile", "makefile", "GNUmakefile", "build.rs", "package.json", ".npmrc",
    ".yarnrc", ".yarnrc.yml", "Rakefile", "justfile", "Taskfile.yml",
})
_RUN_BY_DIR = (".cargo/", ".ci/")


def _folded(names: frozenset[str], dirs: tuple[str, ...]) -> tuple[frozenset[str], tuple[str, ...]]:
    # Case is ignored: on a case-insensitive checkout (macOS, Windows) `Agents.md` is obeyed.
    return frozenset(n.casefold() for n in names), tuple(f"/{d.casefold()}" for d in dirs)


_CI, _OBEYED, _RUNNERS = (_folded(_CI_BY_NAME, _CI_BY_DIR), _folded(_OBEYED_BY_NAME, _OBEYED_BY_DIR),
                          _folded(_RUN_BY_NAME, _RUN_BY_DIR))


def _named(paths: dict[str, str], kind: tuple[frozenset[str], tuple[str, ...]]) -> list[str]:
    """The paths (path -> its casefolded form) with one of the kind's names, or in (or a
    link named as) one of its directories, at any depth."""
    names, dirs = kind
    return [path for path, folded in paths.items()
            if folded.rsplit("/", 1)[-1] in names or any(d in f"/{folded}/" for d in dirs)]


def host_code(changes: list[PathChange], role: Role, steered: tuple[str, ...] = ()) -> list[Finding]:
    """Part of path-policy: executable project content (see above: CI and hook files, and
    the tree paths the repository's config has git run (`steered`, config_steered), what
    direnv, editors and agents obey, test and build runners), and git repositories
    smuggled in as plain files (failed: git run inside one obeys its config)."""
    folded = {p: p.casefold() for p in sorted({c.path for c in changes if c.status != "D"})}
    # A deletion changes what runs too (the workflow that runs the check, the hooks config).
    everything = {p: p.casefold() for p in sorted({c.path for c in changes})}
    steers = tuple(s.casefold() for s in steered)
    ci = _named(everything, _CI)
    ci += [p for p, f in folded.items() if p not in ci and _steers(f, steers)]
    obeyed = [p for p in _named(everything, _OBEYED) if p not in ci]
    runs = [p for p in _named(folded, _RUNNERS) + [p for p in folded if p.endswith(".pth")]
            if p not in ci and p not in obeyed]
    paths = list(folded)
    findings = []
    if ci:
        findings.append(Finding("path-policy", f"{len(ci)} file(s) that CI or git hooks run by themselves changed"
                                + ("" if role.ci_files == "warn" else " (a role may allow it: ci_files = \"warn\")"),
                                tuple(ci), WARN if role.ci_files == "warn" else FAIL))
    if obeyed:
        severity = role.run_files_severity
        findings.append(Finding("path-policy", f"{len(obeyed)} file(s) that direnv, editors or the next agent obey "
                                "by themselves changed" + ("" if severity == WARN else
                                                           " (a role may allow it: run_files = \"warn\")"),
                                tuple(obeyed), severity))
    repos = _embedded_repositories(paths)
    if repos:
        findings.append(Finding("path-policy", f"{len(repos)} git repositor{'y' if len(repos) == 1 else 'ies'} "
                                "added as plain files: git run inside one runs its config's programs", tuple(repos)))
    if runs:
        findings.append(Finding("path-policy", f"{len(runs)} file(s) that test or build runners run changed: review "
                                "them before running anything", tuple(runs), WARN))
    return findings


def _embedded_repositories(paths: list[str]) -> list[str]:
    """Directories that git would take for a repository: HEAD beside objects and refs (git
    asks only that it may enter them: a directory, a link, or an executable file will do)."""
    present = set(paths)
    found = []
    for path in paths:
        if path.rsplit("/", 1)[-1] != "HEAD":
            continue
        top = path[: -len("HEAD")]
        if all(top + name in present or any(p.startswith(top + name + "/") for p in present)
               for name in ("objects", "refs")):
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
    """One gate's status and what it found."""

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
