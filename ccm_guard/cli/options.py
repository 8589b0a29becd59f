"""What every command shares: click's settings, the one error handler, the run options."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from ccm_guard.errors import ExitCode, GuardError

F = TypeVar("F", bound=Callable[..., Any])

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def complete_tasks(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion: the ids of known tasks (README, "Shell completion")."""
    try:
        from ccm_guard.state.registry import Registry

        registry = Registry()
        try:
            return [t.id for t in registry.list(live_only=False) if t.id.startswith(incomplete)]
        finally:
            registry.close()
    except Exception:  # a completion never prints a traceback into the person's prompt
        return []


def complete_roles(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion: the roles of this repository's policy (the built-in ones outside one)."""
    from ccm_guard import policy

    try:
        from ccm_guard.detect.policy_at import for_checkout

        names = sorted(for_checkout(Path.cwd(), "HEAD", None)[1].roles)
    except Exception:
        names = sorted(policy.BUILTIN)
    return [n for n in names if n.startswith(incomplete)]


def handled(fn: F) -> F:
    """One handler for every expected failure: one line, a documented exit code."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = kwargs.get("as_json", False)
        if as_json:
            from ccm_guard import progress

            progress.quiet()  # stderr may be a terminal, but an orchestrator reads this
        try:
            return fn(*args, **kwargs)
        except GuardError as exc:
            _fail(exc.message, exc.exit_code, as_json)
        except KeyboardInterrupt:
            _fail("interrupted", ExitCode.INTERRUPTED, as_json)

    return wrapper  # type: ignore[return-value]


SCHEMA = 1  # the version of every --json document's shape: docs/json.md


def json_text(data: dict[str, Any] | list[Any], *, key: str = "items") -> str:
    """Every --json document: one object, `schema` first (a list goes under `key`), so an
    orchestrator can tell which shape it reads."""
    body = {key: data} if isinstance(data, list) else data
    return json.dumps({"schema": SCHEMA, **body}, indent=2)


def _fail(message: str, code: int, as_json: bool) -> None:
    if as_json:
        click.echo(json_text({"error": message, "exit_code": int(code)}))
    click.echo(f"ccm-guard: error: {message}", err=True)
    sys.exit(int(code))


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
    click.option("--sandbox", "sandbox_mode", type=click.Choice(["auto", "landlock", "none"]), default="auto",
                 show_default=True, help="auto: run the agent under Landlock where the kernel has it (everything "
                 "read-only but the worktree, its git metadata and the agent's private home and temp dir), "
                 "unsandboxed where it does not, as the verdict says; landlock: require it; none: opt out."),
    click.option("--no-network", is_flag=True, help="Refuse TCP connect and bind (Landlock ABI 4+), except to the "
                 "agent's model (443, and the port of its base-URL variable) and --allow-port."),
    click.option("--allow-port", "allow_ports", type=click.IntRange(1, 65535), multiple=True, metavar="PORT",
                 help="With --no-network: a TCP port the agent may still connect to (repeatable). Landlock filters "
                 "by port, not host."),
    click.option("--agent", type=click.Choice(["codex", "claude", "gemini", "aider", "generic"]),
                 help="The agent profile (default: found from the program that runs, e.g. claude, codex.js, "
                 "python -m aider). Each known agent gets a private home seeded from yours; see README."),
]


def run_options(fn: F) -> F:
    for option in reversed(_RUN_OPTIONS):
        fn = option(fn)
    return fn
