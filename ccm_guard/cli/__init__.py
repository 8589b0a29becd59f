"""Command line: parse, call one function, render. No git and no policy here.

Each command lives in the module of its concern and is named to the main group here, so
nothing below imports this module back. A command's module is imported when the command
is run (or listed, for --help and completion): `exec` does not pay for the others.
"""

from __future__ import annotations

import gc

# Before the imports: what a command's start makes (modules, classes, functions, ~20k
# objects the collector tracks) lives to its end, and the default threshold (700 new
# objects, net) had the collector walk it some 35 times in an `exec -- true`: 5 ms,
# to free a few hundred objects. Cycles are still collected, less often: what holds
# much (a judging context, a range's changes) must not be tied into one (later.py).
# The whole process keeps this threshold, including a test process that imports it.
gc.set_threshold(100_000)

import atexit
import importlib
import os
import sys
import threading
from typing import Any

import click

from ccm_guard import __version__
from ccm_guard.cli.options import CONTEXT
from ccm_guard.errors import EXIT_CODE_TABLE, ExitCode
from ccm_guard.text import safe

# click >= 8.2 raises this for a group run without arguments (older ones print the help).
_NO_ARGS: type[Exception] | tuple[()] = getattr(click.exceptions, "NoArgsIsHelpError", ())


# name -> (module under ccm_guard.cli, the click command in it)
_COMMANDS = {
    "exec": ("exec", "exec_cmd"), "audit": ("exec", "audit"), "demo": ("demo", "demo"), "task": ("task", "task"),
    "policy": ("repo", "policy"), "check-paths": ("repo", "check_paths"), "verify": ("repo", "verify"),
    "install": ("repo", "install"), "uninstall": ("repo", "uninstall"), "hook": ("repo", "hook"),
    "roots": ("repo", "roots"), "gc": ("gc", "gc_cmd"), "pool": ("pool", "pool"), "server": ("server", "server"),
}


class _OneLineErrors(click.Group):
    """click's own usage errors as ccm-guard's errors are: one line naming the problem and
    where the fix is (click prints four: usage, a hint, a blank line, the error). Commands
    are loaded by name (`_COMMANDS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in _COMMANDS:
            return None
        module, name = _COMMANDS[cmd_name]
        command: click.Command = getattr(importlib.import_module(f"ccm_guard.cli.{module}"), name)
        return command

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


def run() -> None:
    """The installed command and `python -m ccm_guard`: `main`, then out without the
    interpreter's teardown. Freeing the objects of some 200 modules one by one costs
    ~12 ms at the end of every command (a sixth of a whole `exec -- true` on a small
    repository) and does nothing that the process's exit does not. What the teardown
    does that matters is done first, in its order: other threads are waited for, exit
    handlers run (the trash's deleter, the pool's finisher), the streams are flushed.
    Anything unusual (an uncaught exception, a non-numeric exit, a stream that cannot be
    flushed, a profiler or tracer watching) takes the interpreter's own way out instead."""
    try:
        # The installed command's name under `python -m` too: in usage lines, in next
        # steps, and in the variable shell completion is driven by (_CCM_GUARD_COMPLETE).
        code = main(prog_name="ccm-guard")
    except SystemExit as exc:
        code = exc.code
    if (code is not None and not isinstance(code, int)) or sys.getprofile() or sys.gettrace():
        sys.exit(code)  # a profiler or coverage writes its report at the interpreter's exit
    threading._shutdown()  # type: ignore[attr-defined]  # as the interpreter: other threads, then their hooks
    atexit._run_exitfuncs()
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):  # a reader that went away: the interpreter reports it as ever
        sys.exit(code)
    os._exit(code or 0)
