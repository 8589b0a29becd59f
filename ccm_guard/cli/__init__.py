"""Command line: parse, call one function, render. No git and no policy here.

Each command lives in the module of its concern and is added to the main group here,
so nothing below imports this module back.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from ccm_guard import __version__
from ccm_guard.cli import demo, exec, gc, pool, repo, task
from ccm_guard.cli.options import CONTEXT
from ccm_guard.errors import EXIT_CODE_TABLE, ExitCode
from ccm_guard.text import safe

# click >= 8.2 raises this for a group run without arguments (older ones print the help).
_NO_ARGS: type[Exception] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


class _OneLineErrors(click.Group):
    """click's own usage errors as ccm-guard's errors are: one line naming the problem and
    where the fix is (click prints four: usage, a hint, a blank line, the error)."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:  # a caller that handles click's exceptions itself (tests)
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            if isinstance(exc, _NO_ARGS):  # `ccm-guard` alone: the help, as click shows it
                exc.show()
                sys.exit(int(ExitCode.USAGE))
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
            click.echo(f"ccm-guard: error: {exc.format_message()}{where}", err=True)
            sys.exit(int(ExitCode.USAGE))
        except click.ClickException as exc:
            # A message may quote what the agent chose (a lock reason, a path): shown escaped.
            click.echo(f"ccm-guard: error: {safe(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("ccm-guard: interrupted", err=True)
            sys.exit(int(ExitCode.INTERRUPTED))


@click.group(cls=_OneLineErrors, context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
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


for command in (exec.exec_cmd, exec.audit, demo.demo, task.task, repo.policy, repo.check_paths, repo.verify, repo.install,
                repo.uninstall, repo.hook, repo.roots, gc.gc_cmd, pool.pool):
    main.add_command(command)
