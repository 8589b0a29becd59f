"""Command line: parse, call one function, render. No git and no policy here."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from ccm_guard import __version__
from ccm_guard.errors import EXIT_CODE_TABLE, ExitCode, GuardError

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def handled(fn: F) -> F:
    """One handler for every expected failure: one line, a documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        try:
            return fn(*args, **kwargs)
        except GuardError as exc:
            _fail(exc.message, exc.exit_code, as_json)
        except KeyboardInterrupt:
            _fail("interrupted", ExitCode.INTERRUPTED, as_json)

    return wrapper  # type: ignore[return-value]


def _fail(message: str, code: int, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"error": message, "exit_code": int(code)}))
    click.echo(f"ccm-guard: error: {message}", err=True)
    sys.exit(int(code))


@click.group(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.version_option(__version__, prog_name="ccm-guard")
def main() -> None:
    """Run AI coding agents on a real git repository without trusting them.

    \b
    Each run gets its own linked worktree on branch ccm/<task>, made from a recorded
    base commit; the git metadata is snapshotted before and after, straight from the
    files, and the hygiene gates judge what the agent did. Your checkout is not touched.

    \b
    Quick start:
      ccm-guard demo                          # a throwaway repository, two scripted agents
      ccm-guard exec -- ./agent.sh            # run an agent in a guarded worktree
      ccm-guard exec --timeout 600 -- claude -p "fix the failing test"
      ccm-guard task list                     # what ran, and where its worktree is
      ccm-guard audit TASK                    # judge a finished task again

    State (registry, worktrees, logs) lives under $CCM_GUARD_HOME (default ~/.ccm).
    """


# The options of an agent's run, shared by `exec` and `task resume`.
_RUN_OPTIONS = [
    click.option("--timeout", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
                 help="Stop the agent's whole process group after this long (TERM, grace, KILL)."),
    click.option("--grace", type=click.FloatRange(min=0), default=5.0, show_default=True, metavar="SECONDS",
                 help="Time between TERM and KILL when stopping the agent."),
    click.option("--pass-env", "keep_env", multiple=True, metavar="NAME",
                 help="Pass a variable the agent's environment is otherwise scrubbed of (SSH_AUTH_SOCK, GIT_*, ...)."),
    click.option("--pty/--no-pty", "terminal", default=None,
                 help="Give the agent a pseudo-terminal (default: when ccm-guard runs on a terminal)."),
    click.option("--sandbox", "sandbox_mode", type=click.Choice(["none", "landlock", "auto"]), default="none",
                 show_default=True, help="Run the agent under Landlock: everything read-only but the worktree, "
                 "its git metadata and a private temp dir (auto: when the kernel has it)."),
    click.option("--no-network", is_flag=True, help="With --sandbox: refuse TCP connect and bind (Landlock ABI 4+)."),
    click.option("--agent", type=click.Choice(["codex", "claude", "gemini", "aider", "generic"]),
                 help="The agent profile (default: by the command's name). codex gets --add-dir for the roots a "
                 "commit needs when its own workspace-write sandbox is on."),
]


def run_options(fn: F) -> F:
    for option in reversed(_RUN_OPTIONS):
        fn = option(fn)
    return fn


@main.command("exec", context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@run_options
@click.option("--task", "task_id", metavar="ID", help="Task id (default: generated). Sanitised to [A-Za-z0-9._-].")
@click.option("--base", default="HEAD", show_default=True, metavar="REV", help="Commit the task starts from.")
@click.option("--repo", "repo", type=click.Path(file_okay=False, path_type=Path), default=".",
              help="The repository to work on (default: the current directory).")
@click.option("--role", metavar="ROLE",
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
@click.option("--json", "as_json", is_flag=True,
              help="Print the verdict as JSON on stdout (the agent's stdout then goes to stderr).")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@handled
def exec_cmd(task_id: str | None, base: str, repo: Path, timeout: float | None, grace: float, role: str | None,
             policy_file: Path | None, read_only: bool, require_commit: bool | None, on_fail: str, cleanup: bool,
             keep_env: tuple[str, ...], terminal: bool | None, sandbox_mode: str, no_network: bool,
             agent: str | None, as_json: bool, command: tuple[str, ...], apply_on_pass: bool = False,
             snapshot_every: int | None = None, link_dirs: bool = False, use_pool: bool | None = None, sparse: tuple[str, ...] = ()) -> None:
    """Run COMMAND in a new guarded worktree and judge what it did.

    \b
    Put the agent's command after --, e.g.:
      ccm-guard exec -- ./agent.sh
      ccm-guard exec --task fix-login --timeout 900 -- claude -p "fix the login bug"
      ccm-guard exec --read-only --no-require-commit -- ./review.sh

    A relative program path is taken from where you run ccm-guard. The agent runs with
    its cwd in the worktree, in its own session, with SSH agent, tmux, D-Bus, Docker and
    GIT_* variables removed from its environment (--pass-env keeps one).

    The agent's PATH starts with ccm-guard's git shim, and its worktree has guard hooks;
    with --sandbox landlock it can write only its worktree, its git metadata and a
    private temp dir. A commit the sandbox blocked is recovered on the host.

    The gates (by --role): processes, git-metadata, refs-untouched, main-checkout,
    new-commit (or head-frozen for read-only roles), path-policy, limits, clean-tree.
    On pass the worktree and branch are kept for review; nothing is ever removed
    before it is archived.
    """
    from ccm_guard.run.exec import ExecOptions, exec_task
    from ccm_guard.state.registry import Registry
    from ccm_guard.detect.verdict import render, to_json

    opts = ExecOptions(
        command=list(command), start=repo.resolve(), task=task_id, base=base, timeout=timeout,
        grace=grace, role=role, policy=policy_file.resolve() if policy_file else None, read_only=read_only,
        require_commit=require_commit,
        on_fail=on_fail, cleanup=cleanup, keep_env=keep_env, json_stdout=as_json,
        terminal=False if as_json and terminal is None else terminal,
        sandbox=sandbox_mode, no_network=no_network, agent=agent, apply=apply_on_pass,
        snapshot_every=snapshot_every, link_dirs=link_dirs, pool=use_pool, sparse=sparse,
    )
    verdict = exec_task(opts, Registry())
    click.echo(to_json(verdict) if as_json else render(verdict))
    sys.exit(int(verdict.exit_code))


@main.command(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.argument("target", required=False, metavar="[TASK|PATH]")
@click.option("--base", metavar="REF", help="For a worktree ccm-guard did not create: the branch its work started from.")
@click.option("--read-only", is_flag=True, help="Judge as a read-only run (HEAD must not have moved).")
@click.option("--require-commit/--no-require-commit", default=None,
              help="Override whether a new commit is required (default: as the task's run was judged).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
@handled
def audit(target: str | None, base: str | None, read_only: bool, require_commit: bool | None, as_json: bool) -> None:
    """Run the gates again on a finished worktree.

    For a ccm-guard task (by id, or a path inside its worktree) the gates compare against
    the snapshot recorded before the agent started. For any other worktree, only the checks
    that need no earlier snapshot run (clean-tree; new-commit against the merge-base
    with --base).
    """
    from ccm_guard.run.audit import audit_target
    from ccm_guard.state.registry import Registry
    from ccm_guard.detect.verdict import render, to_json

    verdict = audit_target(target, base, Registry(), read_only, require_commit)
    click.echo(to_json(verdict) if as_json else render(verdict))
    sys.exit(0 if verdict.gates_passed else int(ExitCode.GATES_FAILED))


@main.command(context_settings=CONTEXT)
@click.option("--keep", is_flag=True, help="Keep the throwaway repository and print where it is.")
@handled
def demo(keep: bool) -> None:
    """Make a throwaway repository and run two scripted agents through exec.

    The first agent edits a file and commits: it passes. The second also commits, but
    leaves a file uncommitted, plants a hook in .git/hooks and moves your main branch:
    the gates catch all three. Your own repositories and ~/.ccm are not touched.
    """
    from ccm_guard.cli.demo import run_demo

    sys.exit(run_demo(keep))


# The other commands live in their own modules; importing them registers them.
from ccm_guard.cli import repo as cli_repo
from ccm_guard.cli import task as cli_task  # noqa: E402,F401
from ccm_guard.cli import gc as cli_gc  # noqa: E402,F401
from ccm_guard.cli import pool as cli_pool  # noqa: E402,F401
