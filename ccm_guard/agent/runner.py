"""Running the agent: its own session, its output passed through and logged, its time bounded.

On a terminal the agent gets a pseudo-terminal that is proxied (raw mode, window size,
SIGWINCH), so an interactive agent behaves as it does without ccm-guard, Ctrl-C
included: the keystroke reaches the agent's terminal, not ccm-guard. Without a terminal
its stdout and stderr are piped through and logged. A timeout, or a SIGINT/SIGTERM sent
to ccm-guard itself, reaches the whole process group: TERM, a grace period, KILL.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import errno
import fcntl
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import termios
import time
import tty
from pathlib import Path
from typing import BinaryIO, Callable, Iterator, Mapping

from ccm_guard.agent import processes
from ccm_guard.agent.terminal import TerminalFilter
from ccm_guard.errors import AgentNotExecutable, AgentNotFound

# Variables that would let the agent reach beyond its task, and the hooks' skip switches.
SCRUB = (
    "SSH_AUTH_SOCK", "SSH_AGENT_PID", "GPG_AGENT_INFO", "TMUX", "TMUX_PANE", "STY",
    "DBUS_SESSION_BUS_ADDRESS", "XDG_RUNTIME_DIR", "DOCKER_HOST", "DOCKER_CONTEXT",
    "CCM_GUARD_SKIP", "SKIP", "HUSKY", "HUSKY_SKIP_HOOKS", "LEFTHOOK", "LEFTHOOK_EXCLUDE",
    "PRE_COMMIT_ALLOW_NO_CONFIG",
)
SCRUB_PREFIXES = ("GIT_", "CCM_GUARD_")
# The GIT_* variables that say who commits and which config file is the person's: they
# reach the agent (CI, containers and Nix set identity this way). The others point git at
# another repository, index, object store, program or injected config, and are scrubbed.
GIT_KEPT = frozenset({
    "GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_AUTHOR_DATE",
    "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL", "GIT_COMMITTER_DATE",
    "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM",
})


def agent_environment(
    base: Mapping[str, str], keep: tuple[str, ...], task_vars: Mapping[str, str]
) -> dict[str, str]:
    env = {
        k: v for k, v in base.items()
        if k in keep or k in GIT_KEPT or (k not in SCRUB and not k.startswith(SCRUB_PREFIXES))
    }
    env.update(task_vars)
    # A ccm-guard command the agent starts runs in the agent's own process tree, where the
    # run's containment sees it, never in a warm server's child (ccm_guard.warm).
    env["CCM_GUARD_NO_SERVER"] = "1"
    return env


def resolve_command(command: list[str], env: Mapping[str, str], cwd: Path) -> list[str]:
    """The command with its program made absolute, or a clear error (before anything is created).

    A relative path is taken from where ccm-guard was started, not from the worktree, so
    the program that runs is the one the person named, not a copy the agent could edit.
    """
    program = command[0]
    if "/" in program:
        path = Path(cwd, program)
        if not path.exists():
            raise AgentNotFound(f"agent command {program!r} not found: check the path")
        if path.is_dir() or not os.access(path, os.X_OK):
            raise AgentNotExecutable(f"agent command {program!r} is not executable: chmod +x it")
        return [str(path.resolve()), *command[1:]]
    found = shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None:
        raise AgentNotFound(f"agent command {program!r} not found on PATH: install it or give its path")
    return [found, *command[1:]]


@dataclasses.dataclass
class AgentResult:
    """How the agent's process ended, and where its output went."""

    exit_code: int | None  # None when killed by a signal
    signal: int | None
    timed_out: bool
    interrupted: bool
    duration: float
    terminal: bool
    logs: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.interrupted


class _Stop:
    """Set by SIGINT/SIGTERM sent to ccm-guard while the agent runs."""

    def __init__(self) -> None:
        self.requested = False

    def __call__(self, signum: int, frame: object) -> None:
        self.requested = True


@contextlib.contextmanager
def _stop_signals() -> Iterator[_Stop]:
    stop = _Stop()
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield stop
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def run(
    command: list[str], cwd: Path, env: Mapping[str, str], log_dir: Path,
    timeout: float | None, grace: float, terminal: bool | None = None, echo_stdout_to_stderr: bool = False,
    confine: Callable[[], None] | None = None, started: Callable[[], None] | None = None,
) -> AgentResult:
    """Run the agent; `confine` runs in the child right before exec (the OS sandbox);
    `started` here once the agent is running (not before: a thread it starts must not
    be running while this process forks the agent)."""
    if terminal is None:
        terminal = sys.stdin.isatty() and sys.stdout.isatty()
    start = time.monotonic()
    deadline = start + timeout if timeout else None
    with _stop_signals() as stop:
        if terminal:
            proc, logs, timed_out = _run_pty(command, cwd, env, log_dir, deadline, grace, stop, confine,
                                             started=started)
        else:
            proc, logs, timed_out = _run_pipes(command, cwd, env, log_dir, deadline, grace, stop,
                                               sys.stderr.buffer if echo_stdout_to_stderr else sys.stdout.buffer,
                                               confine, started=started)
    code = proc.returncode
    return AgentResult(
        exit_code=code if code >= 0 else None, signal=-code if code < 0 else None,
        timed_out=timed_out, interrupted=stop.requested, duration=time.monotonic() - start,
        terminal=terminal, logs=logs,
    )


def _is_terminal(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _spawn(command: list[str], cwd: Path, env: Mapping[str, str], **kw: object) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(command, cwd=cwd, env=dict(env), start_new_session=True, **kw)  # type: ignore[call-overload, no-any-return]
    except FileNotFoundError as exc:
        raise AgentNotFound(f"agent command {command[0]!r} not found") from exc
    except PermissionError as exc:
        raise AgentNotExecutable(f"agent command {command[0]!r} is not executable: chmod +x it") from exc


def _must_stop(proc: subprocess.Popen[bytes], deadline: float | None, stop: _Stop, grace: float) -> bool:
    """Stop the group on timeout or on request; True if it was the timeout."""
    timed_out = deadline is not None and time.monotonic() > deadline
    if (timed_out or stop.requested) and proc.poll() is None:
        processes.kill_group(proc.pid, grace)
    return timed_out


def _run_pipes(
    command: list[str], cwd: Path, env: Mapping[str, str], log_dir: Path,
    deadline: float | None, grace: float, stop: _Stop, echo_out: BinaryIO, confine: Callable[[], None] | None,
    *, started: Callable[[], None] | None,
) -> tuple[subprocess.Popen[bytes], tuple[str, ...], bool]:
    out_log, err_log = log_dir / "agent.stdout.log", log_dir / "agent.stderr.log"
    # A terminal on stdin is the person's: the agent could write escape sequences to it,
    # past the filter its output goes through, or push input into it (TIOCSTI). Without a
    # pty it gets no terminal; piped input (a prompt on stdin) still reaches it.
    stdin = subprocess.DEVNULL if _is_terminal(0) else None
    proc = _spawn(command, cwd, env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=confine)
    if started is not None:
        started()
    assert proc.stdout is not None and proc.stderr is not None
    sinks: dict[int, tuple[CappedLog, BinaryIO]] = {
        proc.stdout.fileno(): (CappedLog(out_log), echo_out),
        proc.stderr.fileno(): (CappedLog(err_log), sys.stderr.buffer),
    }
    # What is echoed may reach a terminal: filtered as the pty proxy filters it.
    shown = {fd: TerminalFilter() for fd in sinks}
    timed_out = False
    exited_at: float | None = None
    try:
        while sinks:
            if proc.poll() is not None:
                # A child the agent left behind may hold the pipes open: drain briefly, then stop.
                exited_at = exited_at or time.monotonic()
                if time.monotonic() - exited_at > 0.2:
                    break
            elif _must_stop(proc, deadline, stop, grace):
                timed_out = True
            ready, _, _ = select.select(list(sinks), [], [], 0.05)
            for fd in ready:
                data = _read(fd)
                if not data:
                    sinks.pop(fd)[0].close()
                    continue
                log, echo = sinks[fd]
                log.write(data)
                with contextlib.suppress(OSError, ValueError):
                    echo.write(shown[fd].feed(data))
                    echo.flush()
    finally:
        for log, _ in sinks.values():
            log.close()
        proc.stdout.close()
        proc.stderr.close()
    proc.wait()
    return proc, (str(out_log), str(err_log)), timed_out


LOG_HEAD = LOG_TAIL = 8 << 20  # bytes of an output log kept from its start and from its end


class CappedLog:
    """An agent's output log of at most LOG_HEAD + LOG_TAIL bytes: the first and the last
    of what it printed, with a line saying how much was cut between (an agent printing
    300 MB used to leave a 290 MB log). The tail is held in memory until the run ends.
    Writes are best effort: an agent that fills the disk must not stop the run."""

    def __init__(self, path: Path) -> None:
        self._fh = open(path, "wb")
        self._head = 0
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._cut = 0

    def write(self, data: bytes) -> None:
        room = LOG_HEAD - self._head
        if room > 0:
            self._put(data[:room])
            self._head += min(room, len(data))
            data = data[room:]
        if data:
            self._tail.append(data)
            self._tail_size += len(data)
            while self._tail_size - len(self._tail[0]) >= LOG_TAIL:  # whole chunks beyond the bound
                self._cut += len(self._tail[0])
                self._tail_size -= len(self._tail.popleft())

    def close(self) -> None:
        tail = b"".join(self._tail)
        if len(tail) > LOG_TAIL:
            self._cut += len(tail) - LOG_TAIL
            tail = tail[-LOG_TAIL:]
        if self._cut:
            self._put(f"\n[ccm-guard: {self._cut} bytes of output cut here; the log keeps "
                      f"the first and the last {LOG_TAIL >> 20} MiB]\n".encode())
        self._put(tail)
        with contextlib.suppress(OSError):
            self._fh.close()

    def _put(self, data: bytes) -> None:
        if data:
            with contextlib.suppress(OSError):
                self._fh.write(data)
                self._fh.flush()


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError as exc:
        if exc.errno == errno.EIO:  # the pty's other side is gone
            return b""
        raise


def _run_pty(
    command: list[str], cwd: Path, env: Mapping[str, str], log_dir: Path,
    deadline: float | None, grace: float, stop: _Stop, confine: Callable[[], None] | None,
    *, started: Callable[[], None] | None,
) -> tuple[subprocess.Popen[bytes], tuple[str, ...], bool]:
    log_path = log_dir / "agent.pty.log"
    master, slave = pty.openpty()
    _copy_winsize(sys.stdin.fileno(), master)

    def controlling_tty() -> None:  # runs in the child, after setsid
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if confine is not None:
            confine()

    proc = _spawn(command, cwd, env, stdin=slave, stdout=slave, stderr=slave, preexec_fn=controlling_tty)
    os.close(slave)
    if started is not None:
        started()
    old_winch = signal.signal(signal.SIGWINCH, lambda *_: _copy_winsize(sys.stdin.fileno(), master))
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin)
    timed_out = False
    try:
        tty.setraw(stdin)
        log = CappedLog(log_path)
        try:
            timed_out = _proxy(proc, master, stdin, log, deadline, grace, stop)
        finally:
            log.close()
    finally:
        termios.tcsetattr(stdin, termios.TCSAFLUSH, saved)
        signal.signal(signal.SIGWINCH, old_winch)
        os.close(master)
    proc.wait()
    return proc, (str(log_path),), timed_out


def _proxy(
    proc: subprocess.Popen[bytes], master: int, stdin: int, log: CappedLog,
    deadline: float | None, grace: float, stop: _Stop,
) -> bool:
    timed_out = False
    inputs = [master, stdin]
    shown = TerminalFilter()  # the log keeps everything; the terminal gets no clipboard writes
    while master in inputs:
        if proc.poll() is None and _must_stop(proc, deadline, stop, grace):
            timed_out = True
        try:
            ready, _, _ = select.select(inputs, [], [], 0.05)
        except InterruptedError:
            continue
        if master in ready:
            data = _read(master)
            if not data:
                break
            log.write(data)
            os.write(sys.stdout.fileno(), shown.feed(data))
        if stdin in ready:
            data = os.read(stdin, 4096)
            if data:
                os.write(master, data)
            else:
                inputs.remove(stdin)
        if proc.poll() is not None and not select.select([master], [], [], 0)[0]:
            break
    shown.finish()
    return timed_out


def _copy_winsize(src: int, dst: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.ioctl(dst, termios.TIOCSWINSZ, fcntl.ioctl(src, termios.TIOCGWINSZ, b"\0" * 8))
