"""`ccm-guard exec` and `ccm-guard audit`: one agent run, and its judgement again later."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ccm_guard.cli.options import (
    CONTEXT,
    complete_roles,
    complete_tasks,
    handled,
    run_options,
)
from ccm_guard.errors import EXIT_CODE_TABLE, ExitCode, ForkRefused, UsageError

if TYPE_CHECKING:
    from ccm_guard.agent.options import ExecOptions


@click.command("exec", context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@run_options
@click.option("--task", "task_id", metavar="ID", help="Task id (default: generated). Sanitised to [A-Za-z0-9._-].")
@click.option("--base", default="HEAD", show_default=True, metavar="REV", help="Commit the task starts from.")
@click.option("--repo", "repo", type=click.Path(file_okay=False, path_type=Path), default=".",
              help="The repository to work on (default: the current directory).")
@click.option("--role", metavar="ROLE", shell_complete=complete_roles,
              help="The agent's role: implementor (default), test-writer, reviewer, qa, or one from the policy.")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A policy file applied on top of the built-in, user and repository policies.")
@click.option("--read-only", is_flag=True, help="Force a read-only run: HEAD and the branch must not move.")
@click.option("--require-commit/--no-require-commit", default=None,
              help="Fail unless the agent made a new commit (default: as the role says).")
@click.option("--on-fail", type=click.Choice(["keep", "discard"]), default="keep", show_default=True,
              help="On failure keep the worktree, or archive all work to refs/ccm-guard/archive/<task> and remove it.")
@click.option("--cleanup", is_flag=True, help="On pass, archive the work and remove worktree and branch.")
@click.option("--apply", "apply_on_pass", is_flag=True,
              help="On pass, apply the task into the branch checked out here (as `task apply` does).")
@click.option("--link-dirs", is_flag=True,
              help="Directories .worktreeinclude names (node_modules/, ...) are symlinked into the worktree "
              "instead of copied; the agent can then write into your checkout's copy.")
@click.option("--snapshot-every", type=click.IntRange(min=0), default=None, metavar="N",
              help="Keep a snapshot ref (refs/ccm-guard/snapshots/<task>/<n>) at every Nth commit; 0: none "
              "(default: the role's snapshot_every, 10 unless the policy says otherwise).")
@click.option("--pool/--no-pool", "use_pool", default=None,
              help="Take the worktree from the warm pool (`ccm-guard pool fill`), else make a fresh one "
              "(default: when the repository has a pool).")
@click.option("--sparse", "sparse", multiple=True, metavar="DIR",
              help="Check out only this directory (cone mode; repeatable); a change outside it fails path-policy. "
              "Never pooled.")
@click.option("--setup", "setup", multiple=True, metavar="CMD",
              help="Run CMD (with /bin/sh) in the fresh worktree before the agent, in its sandbox; repeatable, in "
              "order. Replaces the policy's `setup`. What setup leaves is not blamed on the agent; a failing "
              "setup stops the run (exit 10).")
@click.option("--no-setup", is_flag=True, help="Skip the policy's setup step for this run.")
@click.option("--setup-timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
              help="Time for all setup commands together (default: the role's setup_timeout, 600).")
@click.option("--check", metavar="CMD",
              help="After an agent whose run passed, run CMD (e.g. 'pytest -q') in its worktree, in its sandbox; "
              "its result goes into the verdict and a fork comparison, and what it writes is put back.")
@click.option("--check-timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              metavar="SECONDS", help="Time for --check.")
@click.option("--fork", "fork_count", type=click.IntRange(min=2), metavar="N",
              help="Run N tasks TASK-1 ... TASK-N of the command from one base, side by side, and compare them "
              "(`ccm-guard task pick TASK-K` applies one and archives the rest).")
@click.option("--fork-cmd", "fork_cmds", multiple=True, metavar="CMD",
              help="With forks, a different command per fork (repeatable, run with /bin/sh); N defaults to "
              "their count and no command after -- is needed.")
@click.option("--jobs", type=click.IntRange(min=1), metavar="J",
              help="Forks running at once (default: the number of cores).")
@click.option("--group", hidden=True, help="The fork group this run belongs to (set by --fork for each fork).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the verdict as JSON on stdout (the agent's stdout then goes to stderr).")
@click.argument("command", nargs=-1, required=False, type=click.UNPROCESSED)
@handled
def exec_cmd(task_id: str | None, base: str, repo: Path, timeout: float | None, grace: float, role: str | None,
             policy_file: Path | None, read_only: bool, require_commit: bool | None, on_fail: str, cleanup: bool,
             keep_env: tuple[str, ...], terminal: bool | None, sandbox_mode: str, no_network: bool,
             allow_ports: tuple[int, ...], agent: str | None, as_json: bool, command: tuple[str, ...], apply_on_pass: bool = False,
             snapshot_every: int | None = None, link_dirs: bool = False, use_pool: bool | None = None, sparse: tuple[str, ...] = (),
             setup: tuple[str, ...] = (), no_setup: bool = False, setup_timeout: float | None = None,
             check: str | None = None, check_timeout: float = 600.0, fork_count: int | None = None,
             fork_cmds: tuple[str, ...] = (), jobs: int | None = None, group: str | None = None) -> None:
    """Run COMMAND in a new guarded worktree and judge what it did.

    \b
    Put the agent's command after --, e.g.:
      ccm-guard exec -- ./agent.sh
      ccm-guard exec --task fix-login --timeout 900 -- claude -p "fix the login bug"
      ccm-guard exec --read-only --no-require-commit -- ./review.sh
      ccm-guard exec --setup "npm ci" -- claude -p "make the tests pass"
      ccm-guard exec --fork 3 --check "pytest -q" -- claude -p "fix the flaky test"

    A relative program path is taken from where you run ccm-guard. The agent runs with
    its cwd in the worktree, in its own session, with SSH agent, tmux, D-Bus, Docker and
    the GIT_* variables that point git elsewhere removed from its environment (who
    commits - GIT_AUTHOR_*, GIT_COMMITTER_*, GIT_CONFIG_GLOBAL - stays; --pass-env keeps
    another).

    By default the agent is sandboxed (Landlock, where the kernel has it): it can write
    only its worktree, its git metadata, and a private home and temp dir. Claude Code,
    Codex and Gemini CLI each get their own home seeded from yours (credentials,
    settings, your trust of this repository); nothing they write there reaches yours.
    Its PATH starts with ccm-guard's git shim, and its worktree has guard hooks. A commit
    the sandbox blocked is recovered on the host.

    The gates (by --role): processes, git-metadata, refs-untouched, main-checkout,
    new-commit (or head-frozen for read-only roles), path-policy, limits, clean-tree,
    and agent-home (hooks, MCP servers or permissions the agent added to its home).
    On pass the worktree and branch are kept for review; nothing is ever removed
    before it is archived.
    """
    from ccm_guard.agent.options import ExecOptions
    from ccm_guard.run.tasks import execute
    from ccm_guard.state.registry import Registry

    if no_setup and setup:
        raise UsageError("--setup and --no-setup contradict each other: give one")
    if terminal and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UsageError("--pty needs a terminal on stdin and stdout: run it from a terminal, or drop --pty")
    opts = ExecOptions(
        command=list(command), start=repo.resolve(), task=task_id, base=base, timeout=timeout,
        grace=grace, role=role, policy=policy_file.resolve() if policy_file else None, read_only=read_only,
        require_commit=require_commit,
        on_fail=on_fail, cleanup=cleanup, keep_env=keep_env, json_stdout=as_json,
        terminal=False if as_json and terminal is None else terminal,
        sandbox=sandbox_mode, no_network=no_network, allow_ports=allow_ports, agent=agent, apply=apply_on_pass,
        snapshot_every=snapshot_every, link_dirs=link_dirs, pool=use_pool, sparse=sparse,
        setup=() if no_setup else setup or None, setup_timeout=setup_timeout,
        check=check, check_timeout=check_timeout, group=group,
    )
    if fork_count is not None or fork_cmds:
        _fork(opts, fork_count, fork_cmds, jobs, as_json)
    if not command:
        raise UsageError("no agent command: put it after -- (ccm-guard exec -- claude -p '...'; "
                         "see `ccm-guard exec --help`)")
    verdict = execute(opts, Registry())
    # Imported after the run, by when judging has brought in what it needs.
    from ccm_guard.cli.render import render, to_json

    click.echo(to_json(verdict) if as_json else render(verdict))
    sys.exit(int(verdict.exit_code))


def _fork(opts: "ExecOptions", count: int | None, fork_cmds: tuple[str, ...], jobs: int | None,
          as_json: bool) -> None:
    """The forks of `exec --fork`, then their comparison; exit 0 when one can be picked."""
    # What every fork runs, imported here once: the forks are this process forked.
    import ccm_guard.pathrules.rules  # noqa: F401
    import ccm_guard.pool.admin  # noqa: F401
    import ccm_guard.run.tasks  # noqa: F401
    import ccm_guard.worktree.include  # noqa: F401
    from ccm_guard.run.exec import import_judging

    import_judging()  # what each run imports while its agent runs: once, here
    from ccm_guard.cli.options import json_text
    from ccm_guard.cli.render import render_comparison
    from ccm_guard.run import fork
    from ccm_guard.state.registry import Registry

    commands = fork.fork_commands(opts.command, count, fork_cmds)
    root = click.get_current_context().find_root().command  # ccm-guard's main group
    group, runs, interrupted = fork.run_forks(opts, commands, jobs or fork.default_jobs(), echo=sys.stderr,
                                 entry=lambda args: root.main(args=args, prog_name="ccm-guard"))
    registry = Registry()
    errors = {r.task: r.error for r in runs if r.error}
    if not any(registry.exists(r.task) for r in runs):  # refused before any fork was made (a bad command)
        if interrupted or not runs:
            raise KeyboardInterrupt
        first = runs[0]
        raise ForkRefused(f"no fork started: {errors.get(first.task) or 'see the output above'}",
                          first.exit_code or int(ExitCode.USAGE))
    comparison = fork.compare(registry, group)
    if as_json:
        click.echo(json_text({**comparison.to_json(), "errors": errors}))
    else:
        click.echo(render_comparison(comparison, errors))
    if interrupted:
        sys.exit(int(ExitCode.INTERRUPTED))
    sys.exit(0 if comparison.best else int(ExitCode.GATES_FAILED))


@click.command(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.argument("target", required=False, metavar="[TASK|PATH]", shell_complete=complete_tasks)
@click.option("--base", metavar="REF", help="For a worktree ccm-guard did not create: the branch its work started from.")
@click.option("--read-only", is_flag=True, help="Judge as a read-only run (HEAD must not have moved).")
@click.option("--require-commit/--no-require-commit", default=None,
              help="Override whether a new commit is required (default: as the task's run was judged).")
@click.option("--accept", is_flag=True,
              help="If the gates pass, record the task as COMMITTED at its current head (an ERRORED task finished "
                   "by hand, or a branch that moved since its run), so that `task apply` takes it.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@handled
def audit(target: str | None, base: str | None, read_only: bool, require_commit: bool | None, accept: bool,
          as_json: bool) -> None:
    """Run the gates again on a finished worktree.

    For a ccm-guard task (by id, or a path inside its worktree) the gates compare against
    the snapshot recorded before the agent started. For any other worktree, only the checks
    that need no earlier snapshot run (clean-tree; new-commit against the merge-base
    with --base).
    """
    from ccm_guard.cli.render import render, to_json
    from ccm_guard.run.audit import audit_target
    from ccm_guard.state.registry import Registry

    verdict = audit_target(target, base, Registry(), read_only, require_commit, accept)
    click.echo(to_json(verdict) if as_json else render(verdict))
    sys.exit(0 if verdict.gates_passed else int(ExitCode.GATES_FAILED))
