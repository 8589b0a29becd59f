"""`exec` and `audit`: create, snapshot, run, snapshot, judge, dispose."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from ccm_guard import failpoints, git, progress, worktree
from ccm_guard.agent import processes, runner
from ccm_guard.agent.options import ExecOptions
from ccm_guard.agent.steps import StepResult, run_steps
from ccm_guard.detect.policy_at import role_at
from ccm_guard.detect.snapshot import (
    Snapshot,
    file_identity,
    main_files,
    take,
)
from ccm_guard.detect.verdict import Checks, Verdict
from ccm_guard.digest import sha256_hex
from ccm_guard.errors import GitError, GuardError, NotARepository, StateError
from ccm_guard.files import identity
from ccm_guard.git import layout
from ccm_guard.later import Later
from ccm_guard.policy import Role
from ccm_guard.prevent import arm as prevention
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry, Task
from ccm_guard.worktree.sparse import sparse_role


INCLUDE_FILE = ".worktreeinclude"  # ccm_guard.worktree.include's (a test holds the two equal)


class PlainDirectory(Exception):
    """The run's start is in no git repository (nothing was created): a copied directory's case."""


def exec_task(opts: ExecOptions, registry: Registry) -> Verdict:
    """A run in a linked worktree; PlainDirectory when there is no repository to make one of."""
    command = runner.resolve_command(opts.command, os.environ, Path.cwd())
    try:
        plan = worktree.plan(opts.start, opts.task, opts.base)
    except NotARepository as exc:
        raise PlainDirectory(str(opts.start)) from exc
    # The policy comes from the base commit, before the agent exists: it cannot edit it.
    role = role_at(layout.host_repo(plan.main.common_dir), plan.base, opts.policy, opts.role,
                   checkout=plan.main.toplevel)
    role = sparse_role(role, opts.sparse)  # a change outside the cone fails path-policy
    checks = Checks.of(role, opts.read_only, opts.require_commit, str(opts.policy) if opts.policy else None)
    prevention.check_options(opts.sandbox, opts.no_network, opts.agent)
    main = plan.main.repo()
    # While git checks out the task's files: read the person's checkout, and compile the
    # role's path rules for the pre-commit hook (pathspec's import is slow, if needed).
    # Read under the sandbox too: Landlock does not govern chmod, which status shows.
    main_status = Later(lambda: main_files(main))
    compiled = Later(lambda: _compiled_rules(role))
    recorded = {**checks.to_json(), **({"group": opts.group} if opts.group else {})}  # a fork's group
    pins, task = worktree.create(plan, registry, opts.command, recorded, pool=opts.pool,
                                 sparse=opts.sparse)
    main_before = main_status.result()
    try:
        notes = _copy_included(plan.main.toplevel, pins.worktree, opts.link_dirs)
        armed = prevention.arm(task, pins, role, command, sandbox_mode=opts.sandbox, no_network=opts.no_network,
                               agent=opts.agent, allow_ports=opts.allow_ports, rules=compiled.result())
        setup, setup_files = _setup(opts, role, task, pins, armed, registry)
        # After arming and setup: its own config and hooks are the baseline.
        before = take(pins, sandboxed=armed.confine is not None)
        index_before = keep_index(pins, Path(task.log_dir), at=before.refs.get(pins.branch_ref) or plan.base,
                                  pristine=setup is None)
    except BaseException:
        with contextlib.suppress(Exception):
            prevention.disarm(pins)
        worktree.abandon(plan, registry)  # nothing of the agent's exists yet: leave nothing behind
        raise
    baseline = write_baseline(Path(task.log_dir, "baseline.json"), before, main_before, setup_files, index_before)
    registry.move(task.id, "ACTIVE", baseline=str(baseline))
    registry.set_option(task.id, "baseline_sha256", file_digest(baseline))
    return run_and_judge(opts, registry, Ready(task=task, pins=pins, role=role, checks=checks, armed=armed,
                                               before=before, main_before=main_before,
                                               notes=(*notes, *armed.notes), setup=setup, setup_files=setup_files,
                                               index_before=index_before))


def _setup(opts: ExecOptions, role: Role, task: Task, pins: Pins, armed: prevention.Armed, registry: Registry
           ) -> tuple[StepResult | None, dict[str, str]]:
    """The setup step, if the run has one, and what it left uncommitted (path -> identity)."""
    commands = role.setup if opts.setup is None else opts.setup
    if not commands:
        return None, {}
    env, marker = _environment(opts, task, pins, armed, registry)
    result = run_steps(commands, worktree=pins.worktree, env=env, log_dir=Path(task.log_dir, "setup"),
                       timeout=opts.setup_timeout or role.setup_timeout, confine=armed.confine, marker=marker)
    return result, main_files(git.Repo(pins.admin_dir, pins.common_dir, pins.worktree))


def _copy_included(main_top: Path, new: Path, link_dirs: bool) -> list[str]:
    """The ignored files `.worktreeinclude` names (.env, node_modules/, ...), as Claude Code does."""
    if not os.path.lexists(main_top / INCLUDE_FILE):
        return []  # as in most repositories: the copying module is not imported
    from ccm_guard.worktree.include import copy_included

    with progress.step(f"copying the files {INCLUDE_FILE} names"):
        result = copy_included(main_top, new, link_dirs)
    how = ", ".join(f"{n} by {kind}" for kind, n in sorted(result.by_how.items()))
    return [f"{INCLUDE_FILE}: brought {result.files} ignored file(s), {result.bytes} bytes ({how or 'none'})",
            *result.warnings, *(f"{INCLUDE_FILE}: skipped {path}: {why}" for path, why in result.skipped[:20])]


def write_baseline(path: Path, before: Snapshot, main_before: Mapping[str, str] | None,
                   setup_files: Mapping[str, str] | None = None, index_before: Mapping[str, Any] | None = None) -> Path:
    path.write_text(json.dumps({"snapshot": before.to_json(), "main_files": main_before,
                                "setup_files": setup_files or {}, "index": index_before}))
    return path


def keep_index(pins: Pins, log_dir: Path, *, at: str, pristine: bool) -> dict[str, Any] | None:
    """ccm-guard's copy of the task's index as it is before the agent (at commit `at`), and
    the identity that shows it untouched since (any write changes its change time): the
    clean-tree gate reads the work tree by its stat data, not by what the agent's index
    says (None: no copy). The copy keeps the index's mtime, by which git tells the entries
    it must not trust (a file written in the same second as the index). `pristine`: no
    setup step ran, so the index is ccm-guard's checkout's (nothing staged or flagged)."""
    copy = log_dir / "index.before"
    try:
        shutil.copy2(pins.admin_dir / "index", copy)
        if any(pins.admin_dir.glob("sharedindex.*")):  # split: made whole, keeping its mtime
            kept = os.lstat(copy)
            git.unsplit_index(git.Repo(pins.admin_dir, pins.common_dir, pins.worktree), copy)
            os.utime(copy, ns=(kept.st_atime_ns, kept.st_mtime_ns))
        st = os.lstat(copy)
    except (OSError, GitError):
        return None
    return {"path": str(copy), "at": at, "pristine": pristine, "identity": identity(st)}


def kept_index(record: object) -> git.KeptIndex | None:
    """The copy `keep_index` made, where it is still exactly as made (else None: every file is read)."""
    if not isinstance(record, dict) or not isinstance(record.get("path"), str) or not isinstance(record.get("at"), str):
        return None
    try:
        st = os.lstat(record["path"])
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or identity(st) != record.get("identity"):
        return None
    return git.KeptIndex(Path(record["path"]), record["at"], record.get("pristine") is True, made_ns=st.st_ctime_ns)


def file_digest(path: Path) -> str:
    """The baseline's digest, kept in the registry: an agent without the sandbox can rewrite
    the file (it is under the state home), and a later audit must not be misled by it."""
    return sha256_hex(path.read_bytes())


class Ready(NamedTuple):
    """A task about to start its agent: made, armed, and its baseline taken."""

    task: Task
    pins: Pins
    role: Role
    checks: Checks
    armed: prevention.Armed
    before: Snapshot  # the metadata snapshot the gates compare against
    main_before: Mapping[str, str] | None  # the person's dirty and untracked files
    notes: tuple[str, ...] = ()  # for the verdict (what .worktreeinclude brought, ...)
    setup: StepResult | None = None  # the setup step's result (its failure: the agent does not run)
    setup_files: Mapping[str, str] | None = None  # what setup left uncommitted: not the agent's
    index_before: Mapping[str, Any] | None = None  # ccm-guard's copy of the index (keep_index)


def import_judging() -> None:
    """What judging the run needs, imported while the agent runs: the gates, recovery and
    disposal are a third of what exec imports (~30 ms), and the agent's first moments
    hide them. Nothing before the agent imports these (tests/run/test_exec.py holds it)."""
    import importlib

    for name in JUDGING_MODULES:
        importlib.import_module(name)


def _build_home_template(armed: prevention.Armed) -> Later[bool] | None:
    home = armed.agent.home
    if home is None or home.template_wanted is None:
        return None
    from ccm_guard.agent.homes import build_template

    launcher, target = armed.agent.command[:armed.agent.launch.head], home.template_wanted
    return Later(lambda: build_template(home.profile, launcher, target))


JUDGING_MODULES = ("ccm_guard.run.judge", "ccm_guard.run.dispose", "ccm_guard.detect.agent_home")


def run_and_judge(opts: ExecOptions, registry: Registry, ready: Ready) -> Verdict:
    """The agent's run and everything after it, for a new task and a resumed one alike."""
    task, pins, role, checks, armed = ready.task, ready.pins, ready.role, ready.checks, ready.armed
    before, main_before = ready.before, ready.main_before
    host = layout.host_repo(pins.common_dir)
    agent: runner.AgentResult | None = None
    leftovers: tuple[str, ...] = ()
    if ready.setup is None or ready.setup.ok:
        env, marker = _environment(opts, task, pins, armed, registry)
        processes.become_subreaper()
        since = processes.now_ticks()
        warm: list[Later[None]] = []
        with processes.watchdog(marker, pins.worktree, since):  # the agent does not outlive ccm-guard
            agent = runner.run(armed.command, pins.worktree, env, Path(task.log_dir), opts.timeout, opts.grace,
                               opts.terminal, echo_stdout_to_stderr=opts.json_stdout, confine=armed.confine,
                               started=lambda: warm.append(Later(import_judging)))
        leftovers = tuple(p.describe() for p in processes.stop(marker, pins.worktree, since))
        for imports in warm:  # after the stop: a failed import must not leave the agent's processes running
            imports.result()
    # Started after the stop, so its process is not taken for one the agent left; it runs
    # while the run is judged (once per installed version of the agent's CLI).
    template = _build_home_template(armed) if agent is not None else None
    failpoints.point("before-gates")
    from ccm_guard.detect import agent_home
    from ccm_guard.run.dispose import dispose
    from ccm_guard.run.judge import (
        identity_note,
        judge,
        read_git_errors,
        record_commit,
        recover_blocked_commit,
    )

    sandboxed = armed.confine is not None
    setup_files = ready.setup_files

    def judged() -> Verdict:
        found = judge(task, pins, before, main_before, registry, checks, leftovers, sandboxed, setup_files,
                      index_before=kept_index(ready.index_before))
        found.agent, found.setup, found.recovery = agent, ready.setup, recovered
        return found

    recovered = None
    verdict = judged()
    if template is not None:
        template.result()  # before --check, whose own leftovers are looked for
    git_errors = read_git_errors(armed.git_log)
    if agent is not None:
        recovered = recover_blocked_commit(verdict, task, pins, role, agent.logs, armed.refusal_log, git_errors)
    if recovered is not None:
        record_commit(registry, task, recovered.commit)  # its trailers are ccm-guard's by right
        verdict = judged()
    if opts.check and verdict.exit_code == 0 and verdict.git_trusted and verdict.head:
        check, setup_files, failed = _check(opts, ready, registry, verdict.head)
        verdict = judged()  # what the check did, the agent's tests did: judged as the agent's
        verdict.check = check
        if failed:
            verdict.errors.append(failed)
    verdict.sandbox, verdict.profile, verdict.identity = armed.sandbox, armed.profile, armed.identity
    if armed.agent.home is not None:
        verdict.gates.append(agent_home.gate(armed.agent.home_before, armed.agent.home.read_watched()))
    verdict.refusals = prevention.read_records(armed.refusal_log)
    verdict.question = read_question(pins.worktree)
    verdict.notes = list(ready.notes)
    # With no identity known before the run, arming's note has already said how to set one.
    identity = identity_note(git_errors) if armed.identity is not None else None
    if identity:
        verdict.notes.append(identity)
    if opts.snapshot_every is None:
        opts = dataclasses.replace(opts, snapshot_every=role.snapshot_every)
    try:
        dispose(verdict, opts, task, pins, host, registry)
    except StateError as exc:  # the verdict still reaches the person (a full disk, seen for real)
        verdict.errors.append(exc.message)
    return verdict


QUESTION_FILE = "question.json"


def _check(opts: ExecOptions, ready: Ready, registry: Registry, head: str
           ) -> tuple[StepResult, Mapping[str, str], str | None]:
    """--check in the passed task's worktree, in its sandbox; then whatever it wrote outside
    ignored files, a commit, a HEAD it moved, are put back: a check never changes the work.
    Returns the result; the setup step's files as the check left them (a cache it wrote
    into an unignored node_modules/ is not the agent's doing); and why putting back
    failed, if it did. The caller judges the run again: the check ran the agent's code
    (its tests), so what the check did counts as the agent's."""
    assert opts.check is not None
    pins = ready.pins
    env, marker = _environment(opts, ready.task, pins, ready.armed, registry)
    result = run_steps((opts.check,), worktree=pins.worktree, env=env, log_dir=Path(ready.task.log_dir, "check"),
                       timeout=opts.check_timeout, confine=ready.armed.confine, marker=marker)
    setup_files = dict(ready.setup_files or {})
    try:
        discarded, moved = _put_back(pins, head, setup_files)
        error = None
    except (GuardError, OSError) as exc:
        discarded, moved = [], False
        error = f"--check changed the worktree and it could not all be put back: {getattr(exc, 'message', exc)}"
    _record_setup_files(registry, ready.task, setup_files)
    return dataclasses.replace(result, discarded=tuple(discarded), moved_branch=moved), setup_files, error


def _put_back(pins: Pins, head: str, setup_files: dict[str, str]) -> tuple[list[str], bool]:
    """The task's branch, HEAD, index and files as they were before the check, except the
    setup step's files, which keep what the check wrote (their identities updated in
    `setup_files`). Returns the paths put back and whether a commit or checkout was undone."""
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    wrote = {e.path for e in git.status(repo)} - set(setup_files)  # as it left them: for the report
    now = git.resolve_commit(repo, pins.branch_ref)
    moved = now != head
    on_branch = git.symbolic_head(repo) == pins.branch_ref
    if moved:  # through HEAD where it can: the worktree's HEAD reflog then records the move too
        git.update_ref(repo, "HEAD" if on_branch else pins.branch_ref, head, now,
                       message="ccm-guard: undo what --check committed")
    if not on_branch:
        git.set_symbolic_head(repo, pins.branch_ref)
        moved = True
    entries = git.status(repo)  # against the agent's commit again: what differs now is the check's
    ours = [e for e in entries if e.path not in setup_files]
    for entry in ours:  # first: a file to restore may need the place a new one took
        if entry.code == "??":
            _remove(pins.worktree / entry.path)
    tracked = [e.path for e in ours if e.code != "??"]
    for path in tracked:
        if (pins.worktree / path).is_dir() and not (pins.worktree / path).is_symlink():
            _remove(pins.worktree / path)  # a directory where the agent committed a file
    git.restore_paths(repo, head, tracked)
    git.restore_paths(repo, head, [e.path for e in entries if e.path in setup_files and e.code[0] not in ".?"],
                      work_tree=False)  # a setup file the check committed: its edit stays, unstaged
    for entry in git.status(repo):
        if entry.path in setup_files:
            setup_files[entry.path] = file_identity(pins.worktree, entry)
    return sorted(wrote | {e.path for e in ours}), moved


def _remove(path: Path) -> None:
    """Remove what is at `path`, a link as a link, gone or not."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except (FileNotFoundError, NotADirectoryError):
        pass


def _record_setup_files(registry: Registry, task: Task, setup_files: Mapping[str, str]) -> None:
    """The setup files as the check left them, into the task's baseline (and its digest):
    a later audit or resume judges from there."""
    row = registry.get(task.id)
    if not row.baseline or not os.path.exists(row.baseline) \
            or file_digest(Path(row.baseline)) != row.option("baseline_sha256"):
        return  # (a baseline changed behind ccm-guard's back is not made good here: audit refuses it)
    data = json.loads(Path(row.baseline).read_text())
    if data.get("setup_files", {}) == dict(setup_files):
        return
    data["setup_files"] = dict(setup_files)
    Path(row.baseline).write_text(json.dumps(data))
    registry.set_option(task.id, "baseline_sha256", file_digest(Path(row.baseline)))


def _environment(opts: ExecOptions, task: Task, pins: Pins, armed: prevention.Armed, registry: Registry
                 ) -> tuple[dict[str, str], str]:
    """The agent's (and the setup step's) environment, and the marker every process of the
    run carries in it: how ccm-guard finds the processes it must stop."""
    marker = f"CCM_GUARD_RUN={task.id}:{os.urandom(8).hex()}"
    env = runner.agent_environment(os.environ, opts.keep_env, {
        **armed.env, "CCM_GUARD_TASK": task.id, "CCM_GUARD_WORKTREE": str(pins.worktree),
        "CCM_GUARD_SUMMARY": str(Path(task.log_dir, "agent", "summary")),
        "CCM_GUARD_QUESTION": str(pins.worktree / QUESTION_FILE),
        marker.split("=", 1)[0]: marker.split("=", 1)[1],
    })
    registry.set_option(task.id, "marker", marker)  # discard refuses while such a process lives
    return env, marker


def read_question(worktree_dir: Path) -> str | None:
    """The agent's question, if it left one (docs/design-notes.md#blocked-tasks-ask-a-question): its "question" field, else
    the text. Read without following a link and capped: the agent wrote it."""
    path = worktree_dir / QUESTION_FILE
    if not os.path.lexists(path):
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            raw = fh.read(1 << 16).decode("utf-8", "replace")
    except OSError as exc:
        return f"({QUESTION_FILE} could not be read: {exc.strerror})"
    try:
        data = json.loads(raw)
    except ValueError:
        return raw.strip()
    if isinstance(data, dict) and isinstance(data.get("question"), str):
        return str(data["question"])
    return raw.strip()


def _compiled_rules(role: Role) -> dict[str, Any]:
    from ccm_guard.pathrules.rules import Rules

    return Rules(role.allow, role.forbid).to_data()


