"""Command line for `ccm-guard server`: start, stop and ask the warm server (ccm_guard.warm)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import click

from ccm_guard.cli.options import CONTEXT, handled, json_text
from ccm_guard.errors import StateError, UsageError

SERVER_EPILOG = """\
\b
Exit codes:
  0    done (and for `status`: whether one runs is in the output)
  2    the server cannot start here (no Landlock ABI 6, inside a sandbox, it did not come up)
  7    the state home cannot be made"""

READY_WITHIN = 15.0  # seconds: importing everything takes a fraction of one


@click.group("server", context_settings=CONTEXT, epilog=SERVER_EPILOG)
def server() -> None:
    """A warm server: commands without Python's start-up (opt-in).

    \b
    Every ccm-guard command spends some 45 ms starting Python and importing click and its
    own modules before it does anything. A warm server has done that once: while it
    runs, a command with no terminal (an orchestrator's, CI's, a script's) hands itself
    to it and a forked child runs it, with the command's streams, directory, umask,
    environment and arguments. Anything else, and any command the server declines
    (another interpreter, other resource limits, a sandbox...), runs as ever.
    One server serves one installation and state home ($CCM_GUARD_HOME); it leaves
    after --idle seconds without a command, or when the installed package changes.
    It needs Landlock ABI 6, whose scoping keeps sandboxed agents from reaching it.
    Set CCM_GUARD_NO_SERVER=1 to keep a command (and what it starts) off it.

    \b
      ccm-guard server start            # in the background; prints its pid
      ccm-guard server status --json
      ccm-guard server stop             # running commands finish first
    """


@server.command("start", context_settings=CONTEXT, epilog=SERVER_EPILOG)
@click.option("--idle", type=click.FloatRange(min=1), default=1800, show_default=True, metavar="SECONDS",
              help="Leave after this long without a command.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's status as JSON.")
@handled
def start(idle: float, as_json: bool) -> None:
    """Start the warm server in the background, or report the one that runs."""
    from ccm_guard.prevent import sandbox
    from ccm_guard.state.home import home

    if sandbox.abi() < 6:
        raise UsageError(f"a warm server needs Landlock ABI 6 or later to keep sandboxed agents from reaching it "
                         f"({sandbox.describe()}): commands run without one")
    if _confined():
        raise UsageError("this process is confined (no_new_privs: a sandbox): start the server outside it")
    state = _ask(b"status")
    if state is None:
        holder = _holder()
        if holder is not None:
            raise UsageError(f"the warm server's name is held by process {holder}, which is not an unconfined process "
                             f"of yours (a sandboxed agent's?): stop it (kill {holder}), then start again")
        log = home() / "server.log"
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StateError(f"cannot make the state home {log.parent} ({exc.strerror}): set CCM_GUARD_HOME to a "
                             "directory you can write") from exc
        proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "server", "run", "--idle", str(idle),
                                 "--log", str(log)], cwd="/", start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state = _wait_ready(proc, log)
        state["started_now"] = state.get("pid") == proc.pid  # or another `start` won the race
    else:
        state["started_now"] = False
    _show(state, as_json)


@server.command("stop", context_settings=CONTEXT, epilog=SERVER_EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print what was stopped as JSON.")
@handled
def stop(as_json: bool) -> None:
    """Stop the warm server: it takes no new command, and leaves when the running ones end."""
    state = _ask(b"status")
    if state is not None:
        _ask(b"stop")
    if as_json:
        click.echo(json_text({"running": False, "stopped": state}))
    else:
        click.echo(f"warm server {state['pid']} stopped" if state else "no warm server runs for this state home")


@server.command("status", context_settings=CONTEXT, epilog=SERVER_EPILOG)
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
@handled
def status(as_json: bool) -> None:
    """Whether a warm server runs for this installation and state home, and what it did."""
    _show(_ask(b"status"), as_json)


@server.command("run", hidden=True, context_settings=CONTEXT)
@click.option("--idle", type=click.FloatRange(min=1), default=1800)
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), required=True)
@handled
def run_server(idle: float, log_path: Path) -> None:
    """The server itself, in the foreground (`start` runs this detached)."""
    import pkgutil
    import traceback

    import ccm_guard
    from ccm_guard.cli import run
    from ccm_guard.warm.server import ServerError, log_line, serve

    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            # Everything a command may import, so that no child pays for it: the whole
            # package (the command line's modules load by name) and the optional libraries.
            names = [m.name for m in pkgutil.walk_packages(ccm_guard.__path__, "ccm_guard.")
                     if m.name != "ccm_guard.__main__"]
            serve(run=run, preload=[*names, "pathspec", "re2", "sqlite3", "hashlib"], idle=idle, log=log)
        except ServerError as exc:
            log_line(log, f"not started: {exc}")
            raise UsageError(str(exc)) from exc
        except Exception as exc:  # the log is all a detached server has: the traceback goes there
            log_line(log, f"{traceback.format_exc()}not started: {exc}")
            raise UsageError(f"the warm server failed: {exc}") from exc
    finally:
        os.close(log)


def _confined() -> bool:
    from ccm_guard.warm.client import confined

    with open("/proc/self/status", "rb") as f:
        return confined(f.read())


@contextlib.contextmanager
def _connected() -> Iterator[socket.socket | None]:
    """A connection to whatever listens on the server's name (None: nothing does)."""
    from ccm_guard.warm.client import socket_name

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.settimeout(5)  # a name nobody accepts on (a full queue) is refused at once
            sock.connect(socket_name())
        except OSError:
            yield None
        else:
            yield sock


def _ask(what: bytes) -> dict[str, Any] | None:
    """The server's answer to a control request; None when none runs (or it is not one
    to trust: another user's, or a confined process that took the name)."""
    import json

    from ccm_guard.warm.client import trusted_peer

    with _connected() as sock:
        try:
            if sock is None or not trusted_peer(sock):
                return None
            sock.send(what)
            reply = sock.recv(4096)
        except OSError:
            return None
    if what == b"status":
        try:
            return dict(json.loads(reply))
        except ValueError:
            return None
    return {"reply": reply.decode("utf-8", "replace")}


def _holder() -> int | None:
    """The pid of whatever listens on the server's name, if anything does."""
    from ccm_guard.warm.client import peer

    with _connected() as sock:
        return None if sock is None else peer(sock)[0]


def _wait_ready(proc: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        state = _ask(b"status")
        if state is not None:
            return state
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines() if log.exists() else []
    why = lines[-1] if lines else "no reason written"
    raise UsageError(f"the warm server did not come up ({why}); its log: {log}")


def _show(state: dict[str, Any] | None, as_json: bool) -> None:
    if as_json:
        click.echo(json_text({"running": state is not None, **(state or {})}))
    elif state is None:
        click.echo("no warm server runs for this installation and state home (`ccm-guard server start`)")
    else:
        up = time.time() - float(state["started"])
        click.echo(f"warm server {state['pid']}: up {up:.0f} s, {state['served']} command(s) served, "
                   f"{state['commands_running']} running; leaves after {state['idle_seconds']:.0f} s idle")
