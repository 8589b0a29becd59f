"""The warm server: one process that has imported ccm-guard, forking a child per command
that becomes the client's process (its streams, working directory, umask, environment,
arguments and import path) and runs the command line's entry as the command would have.

What a child cannot take from its client, the client must already share with the server,
or the command is declined and runs in the client as ever: the user, capabilities, the
confinement (`NoNewPrivs`, seccomp, a security label), ignored and blocked signals,
resource limits, cgroup, namespaces, root, CPU and memory placement, scheduling, read
from /proc through the peer's pidfd; the interpreter, its version, flags, personality and
every entry of its import path past the first; the variables the interpreter's start
reads (PYTHON*, LC_*, LANG), HOME and the state home; and the code: every file a loaded
module came from, unchanged since the server started. No terminal: the client keeps
those commands (client.py). A command begins only on its client's "go", after the
server said "started": until then the client may run it itself, and never twice.

The server runs nothing but imports before it forks, and is single-threaded (a thread
holding a lock at a fork would leave the child stuck on it). A child dies with the
server (`PR_SET_PDEATHSIG`), and is killed when its client goes away without the
command's end (SIGKILL: what killing the command itself does). Where the kernel has no
Landlock ABI 6 the server does not start: before ABI 6 a sandboxed agent could connect
to it and have commands run outside its sandbox (the sandbox scopes abstract sockets).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import importlib
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ccm_guard import caller
from ccm_guard.warm.client import (
    FORWARDED,
    KILLED,
    MAX_REQUEST,
    PACKAGE,
    SO_PEERPIDFD,
    peer,
    request_fields,
    socket_name,
)

# Lines of /proc/<pid>/status a client must share with the server.
_STATUS = (b"Uid", b"Gid", b"Groups", b"NoNewPrivs", b"Seccomp", b"SigBlk", b"SigIgn", b"CapInh", b"CapPrm",
           b"CapEff", b"CapBnd", b"CapAmb", b"Cpus_allowed_list", b"Mems_allowed_list")
_NAMESPACES = ("cgroup", "ipc", "mnt", "net", "pid", "time", "user", "uts")
# Variables the interpreter's start reads (the streams' encoding, the import path), and
# those the socket's name is made of (the state home, and the home it defaults under).
_START_PREFIXES = (b"PYTHON", b"LC_", b"LANG")
_START_NAMES = (b"CCM_GUARD_HOME", b"HOME")
_PR_SET_PDEATHSIG = 1
_STOPPING = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # what stops the server
PENDING_SECONDS = 2.0  # a client that connected and sent nothing for this long is dropped


def log_line(log: int, text: str) -> None:
    """A line in the server's log (one write on its append-only descriptor); a log that
    cannot be written (a full disk) stops nothing."""
    with contextlib.suppress(OSError, ValueError):
        os.write(log, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [{os.getpid()}] {text}\n".encode())


class ServerError(Exception):
    """The server cannot start (the name is taken, a stream is missing)."""


@dataclass(frozen=True)
class Profile:
    """What a process shares with a served command's child: all of it must be equal."""

    pid: int
    status: tuple[bytes, ...]
    limits: bytes
    cgroup: bytes
    namespaces: tuple[str, ...]
    root: tuple[int, int]  # its root directory (a chroot), by device and inode
    label: bytes  # its security label (AppArmor, SELinux), where a module sets one
    scheduling: tuple[bytes, ...]  # nice, real-time priority, policy, I/O priority, OOM score
    tty: bytes  # its controlling terminal (0: none)
    umask: int  # taken by the child, not compared

    def differs(self, other: Profile) -> str | None:
        """What of `other` differs, or None."""
        for key, mine, theirs in zip(_STATUS, self.status, other.status):
            if mine != theirs:
                return f"its {key.decode()} differs from the server's ({theirs.decode()}; the server's {mine.decode()})"
        for name in ("limits", "cgroup", "namespaces", "root", "label", "scheduling"):
            if getattr(self, name) != getattr(other, name):
                return f"its {name} differ(s) from the server's"
        return "it has a controlling terminal" if other.tty != b"0" else None


def read_profile(pid: int) -> Profile:
    proc = f"/proc/{pid}"
    lines = dict(line.split(b":", 1) for line in _read(f"{proc}/status").splitlines() if b":" in line)
    stat = _read(f"{proc}/stat").rsplit(b")", 1)[1].split()  # field n of proc(5) is stat[n - 3]
    root = os.stat(f"{proc}/root")
    return Profile(pid=pid, status=tuple(lines.get(key, b"").strip() for key in _STATUS), limits=_read(f"{proc}/limits"),
                   cgroup=_read(f"{proc}/cgroup"),
                   namespaces=tuple(os.readlink(f"{proc}/ns/{ns}") for ns in _NAMESPACES),
                   root=(root.st_dev, root.st_ino), label=_label(proc),
                   scheduling=(stat[16], stat[37], stat[38], b"%d" % _io_priority(pid), _read(f"{proc}/oom_score_adj")),
                   tty=stat[4], umask=int(lines.get(b"Umask", b"0022").strip(), 8))


def _label(proc: str) -> bytes:
    try:
        return _read(f"{proc}/attr/current")
    except OSError:  # no security module that labels processes
        return b""


_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "riscv64": 31}  # the syscall's number
_IOPRIO_WHO_PROCESS = 1


def _io_priority(pid: int) -> int:
    """`ionice`'s class and level of `pid` (-1 where the syscall is not known here)."""
    number = _IOPRIO_GET.get(os.uname().machine)
    if number is None:
        return -1
    return int(_libc().syscall(ctypes.c_long(number), ctypes.c_int(_IOPRIO_WHO_PROCESS), ctypes.c_int(pid)))


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def code_files() -> tuple[str, ...]:
    """Every file the server's code came from: each loaded module's (ccm-guard's, click's,
    the standard library's) and the hook template and shim, which a module reads at import."""
    files = {f for module in list(sys.modules.values())
             if isinstance(f := getattr(module, "__file__", None), str)}
    for data in ("hooks", "shims"):  # inside the package when installed, beside it in a checkout
        for where in (os.path.join(PACKAGE, data), os.path.join(os.path.dirname(PACKAGE), data)):
            with contextlib.suppress(OSError):
                files.update(entry.path for entry in os.scandir(where) if entry.is_file())
    return tuple(sorted(files))


def fingerprint(files: tuple[str, ...]) -> tuple[tuple[int, int, int], ...]:
    """The files by identity, size and mtime (-1s: gone): code replaced under the server
    (an upgrade of ccm-guard or of click) must not go on being served."""
    found = []
    for path in files:
        try:
            st = os.stat(path)
        except OSError:
            found.append((-1, -1, -1))
        else:
            found.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(found)


@dataclass
class Request:
    """A command to run, as the client sent it."""

    interpreter: tuple[bytes, bytes, bytes]  # executable, version, flags
    argv: list[bytes]
    env: dict[bytes, bytes]
    path: list[bytes]

    @classmethod
    def parse(cls, fields: list[bytes]) -> Request:
        """ValueError when malformed."""
        interpreter, rest = (fields[1], fields[2], fields[3]), fields[4:]
        argv, rest = _counted(rest)
        env_items, rest = _counted(rest)
        path, rest = _counted(rest)
        if rest:
            raise ValueError("trailing fields")
        env = dict(item.partition(b"=")[::2] for item in env_items)
        if b"" in env:  # execve allows "=x"; os.environ cannot take it
            raise ValueError("an environment entry without a name")
        return cls(interpreter=interpreter, argv=argv, env=env, path=path)


def _counted(fields: list[bytes]) -> tuple[list[bytes], list[bytes]]:
    count = int(fields[0])
    if count < 0 or count > len(fields) - 1:
        raise ValueError("a count past the end")
    return fields[1:1 + count], fields[1 + count:]


def _start_variables(env: dict[bytes, bytes]) -> dict[bytes, bytes]:
    return {k: v for k, v in env.items() if k.startswith(_START_PREFIXES) or k in _START_NAMES}


@dataclass
class Served:
    """A command's child and the client waiting for its end."""

    pid: int
    pidfd: int
    conn: socket.socket | None
    client: int  # the client's pid, for the log
    go: int | None  # the pipe the child waits on until its client says "go" (None: said, or never will be)


@dataclass
class Server:
    run: Callable[[], None]  # the command line's entry; it leaves the process itself
    idle: float  # seconds without a command before the server leaves
    log: int  # the log's descriptor (O_APPEND): a line is one write, and nothing is buffered at a fork
    listener: socket.socket
    profile: Profile = field(init=False)
    code: tuple[str, ...] = field(init=False)
    ignored: set[int] = field(init=False)  # of the signals it handles, those ignored where it started
    spare: int = field(init=False)  # a descriptor kept to be given up at EMFILE
    fingerprint: tuple[tuple[int, int, int], ...] = field(init=False)
    interpreter: tuple[bytes, bytes, bytes] = field(init=False)
    variables: dict[bytes, bytes] = field(init=False)
    children: dict[int, Served] = field(default_factory=dict)  # by pidfd
    waiting: dict[int, Served] = field(default_factory=dict)  # by the client's fd
    # Accepted, their request not yet arrived: by fd, with the moment they are given up.
    pending: dict[int, tuple[socket.socket, float]] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    last: float = field(default_factory=time.monotonic)
    served: int = 0
    stopping: bool = False
    poller: select.poll = field(init=False)
    pipe: tuple[int, int] = field(init=False)  # the signals' wake-up pipe

    def __post_init__(self) -> None:
        mine = request_fields()
        self.interpreter = (mine[1], mine[2], mine[3])
        self.variables = _start_variables(dict(os.environb))
        self.profile = read_profile(os.getpid())
        self.code = code_files()
        self.fingerprint = fingerprint(self.code)
        # Ignored where the server started (and so by its clients: the profiles match):
        # put back in each child. The server itself must reap its children.
        self.ignored = {signum for signum in (*_STOPPING, signal.SIGCHLD) if signal.getsignal(signum) is signal.SIG_IGN}
        self.spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)  # given up to refuse a client at EMFILE

    # --- the loop ---------------------------------------------------------------------------

    def loop(self) -> None:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        for signum in _STOPPING:
            if signum not in self.ignored:  # (started by nohup, or as a background job)
                signal.signal(signum, lambda *_: None)  # the wake-up pipe says it; the loop stops
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # ignored, the kernel would reap them: no exit code to hand on
        self.pipe = (wake_r, wake_w)
        self.poller = select.poll()
        self.poller.register(self.listener, select.POLLIN)
        self.poller.register(wake_r, select.POLLIN)
        while self.children or self.pending or not self.stopping:
            events = self.poller.poll(self.timeout_ms())
            now = time.monotonic()
            if not events and not self.children and not self.pending and now >= self.last + self.idle:
                self.say("idle: leaving")
                self.stop()
            for fd, mask in events:
                try:
                    self.event(fd, mask)
                except Exception:  # noqa: BLE001 - the loop must go on: its running commands die with it
                    self.say(f"error: {traceback.format_exc()}")
                    self.forget_fd(fd)  # not to be woken by it again and again
            for fd, (conn, deadline) in list(self.pending.items()):
                if deadline <= now:  # connected and sent nothing: no one waits for it
                    del self.pending[fd]
                    self.poller.unregister(conn)
                    conn.close()
                    self.say(f"dropped a client that sent nothing within {PENDING_SECONDS:.0f} s")

    def event(self, fd: int, mask: int) -> None:
        if fd == self.pipe[0]:
            with contextlib.suppress(OSError):
                os.read(fd, 512)
            self.say("signalled: leaving once the running commands end")
            self.stop()
        elif fd == self.listener.fileno():
            self.accept()
        elif fd in self.pending:
            self.take(self.pending.pop(fd)[0])
        elif fd in self.children:
            self.ended(self.children[fd])
        elif fd in self.waiting:
            self.from_client(self.waiting[fd], mask)

    def forget_fd(self, fd: int) -> None:
        """After an event of a client's or a child's `fd` failed: it is no longer watched,
        and its command goes (killed, as when its client goes away: its client says the
        server went away). The listener and the wake-up pipe are never forgotten."""
        pending = self.pending.pop(fd, None)
        served = self.children.get(fd) or self.waiting.get(fd)
        if pending is None and served is None:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(fd)
        if pending is not None:
            pending[0].close()
        if served is not None:
            self.forget_client(served)
            self.forget_child(served)

    def forget_child(self, served: Served) -> None:
        """A child no longer watched: killed and reaped here, its descriptors closed."""
        if served.pidfd not in self.children:
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(served.pidfd, signal.SIGKILL)
            os.waitpid(served.pid, 0)
        self.release(served)
        self.say(f"command {served.pid} for client {served.client}: killed (it could not be watched)")

    def release(self, served: Served) -> None:
        """A reaped child's place in the loop: its pidfd and its pipe of "go"."""
        del self.children[served.pidfd]
        with contextlib.suppress(KeyError, ValueError):
            self.poller.unregister(served.pidfd)
        for fd in (served.pidfd, served.go):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        served.go = None

    def timeout_ms(self) -> float | None:
        """How long the loop may sleep: until the first pending client is given up, or
        until the idle time is up (never, while a command runs)."""
        deadlines = [deadline for _, deadline in self.pending.values()]
        if not self.children and not self.stopping:
            deadlines.append(self.last + self.idle)
        return max(0.0, min(deadlines) - time.monotonic()) * 1000 if deadlines else None

    def stop(self) -> None:
        """No new commands (the name goes at once: clients run their commands themselves);
        the running ones are seen to their end."""
        if not self.stopping:
            self.stopping = True
            with contextlib.suppress(KeyError, ValueError):
                self.poller.unregister(self.listener)
            self.listener.close()

    def say(self, text: str) -> None:
        log_line(self.log, text)

    # --- a client ---------------------------------------------------------------------------

    def accept(self) -> None:
        """A client connected: its request is read when it arrives (a client sends at once;
        one that does not must hold up no one)."""
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.refuse_one(exc.strerror or "no descriptor left")
            return
        conn.setblocking(False)
        self.pending[conn.fileno()] = (conn, time.monotonic() + PENDING_SECONDS)
        self.poller.register(conn, select.POLLIN)

    def refuse_one(self, why: str) -> None:
        """Out of descriptors: the spare one is given up to take the client off the queue
        and refuse it (it runs the command itself), or the listener stays readable and the
        loop would spin."""
        if self.spare >= 0:
            os.close(self.spare)
        try:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                time.sleep(0.01)  # the whole system is out of them: spinning would not help it
            else:
                with conn, contextlib.suppress(OSError):
                    conn.send(f"refused {why}".encode())
                self.say(f"refused a client: {why}")
        finally:
            try:
                self.spare = os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                self.spare = -1  # another process took the slot: tried again at the next EMFILE

    def take(self, conn: socket.socket) -> None:
        """A pending client's request (or its hang-up): answered now, or a child started."""
        self.poller.unregister(conn)
        fds: list[int] = []
        try:
            fields, fds, client = self.receive(conn)
            reply = self.answer(conn, fields, fds, client)
        except (OSError, ValueError, IndexError) as exc:
            reply = f"refused {exc}"
        finally:
            for fd in fds:
                os.close(fd)
        if reply is not None:
            if reply.startswith("refused"):
                self.say(reply)
            with contextlib.suppress(OSError):
                conn.send(reply.encode())
            conn.close()

    def receive(self, conn: socket.socket) -> tuple[list[bytes], list[int], Profile]:
        """The request's fields and fds, from a client that is this user's, and its
        profile (OSError/ValueError otherwise, with the fds closed)."""
        pid, uid = peer(conn)
        if uid != os.getuid():
            raise ValueError("another user")
        pidfd = conn.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD)
        try:
            client = read_profile(pid)
            signal.pidfd_send_signal(pidfd, 0)  # the profile read was the peer's, not a successor's
        finally:
            os.close(pidfd)
        data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST + 1, 4)
        if flags & socket.MSG_CTRUNC or len(data) > MAX_REQUEST:
            for fd in fds:
                os.close(fd)
            raise ValueError("a request too large")
        return data.split(b"\0"), fds, client

    def answer(self, conn: socket.socket, fields: list[bytes], fds: list[int], client: Profile) -> str | None:
        """The reply to send now, or None when a child was started (it replies at its end).
        `status` and `stop` are answered to any process of the user (from a terminal too);
        a command runs only for a client that shares the server's profile."""
        if fields[0] == b"status":
            return json.dumps({"pid": os.getpid(), "started": self.started, "served": self.served,
                               "commands_running": len(self.children), "idle_seconds": self.idle,
                               "package": PACKAGE, "python": sys.executable})
        if fields[0] == b"stop":
            self.say("asked to stop")
            self.stop()
            return "stopping"
        if fields[0] != b"run":
            raise ValueError("an unknown request")
        why = self.profile.differs(client)
        if why is not None:
            raise ValueError(why)
        request = Request.parse(fields)
        if len(fds) != 4:
            raise ValueError("not the four descriptors (stdin, stdout, stderr, working directory)")
        if request.interpreter != self.interpreter or request.path[1:] != [os.fsencode(p) for p in sys.path[1:]]:
            raise ValueError("another interpreter, or another import path")
        if _start_variables(request.env) != self.variables:
            raise ValueError("the interpreter's or the state home's variables differ")
        if fingerprint(self.code) != self.fingerprint:
            self.say("the installed package changed: leaving")
            self.stop()
            raise ValueError("the installed package changed since the server started")
        self.fork(conn, request, fds, client)
        return None

    def fork(self, conn: socket.socket, request: Request, fds: list[int], client: Profile) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()  # nothing of the server's may reach the child's streams
        parent = os.getpid()
        go_r, go_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:
            os.close(go_r)
            os.close(go_w)
            raise  # declined: nothing ran
        if pid == 0:
            self.become(parent, conn, request, fds, client, go_r, go_w)  # never returns
        os.close(go_r)
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            # Not to be watched (no descriptor left): it goes before it began (it waits for
            # "go"), and its client, told nothing, runs the command itself.
            os.close(go_w)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            self.say(f"command {pid} for client {client.pid} not started: it cannot be watched ({exc.strerror})")
            raise
        self.served += 1
        self.last = time.monotonic()
        served = Served(pid=pid, pidfd=pidfd, conn=None, client=client.pid, go=go_w)
        self.children[served.pidfd] = served
        self.poller.register(served.pidfd, select.POLLIN)
        try:
            conn.send(b"started")  # the client answers "go"; its forwarded signals come after
        except OSError:  # the client is gone: its child leaves without beginning
            os.close(go_w)
            served.go = None
            conn.close()
            return
        served.conn = conn
        self.waiting[conn.fileno()] = served
        self.poller.register(conn, select.POLLIN)
        conn.setblocking(False)

    def from_client(self, served: Served, mask: int) -> None:
        """The client's "go", a signal to forward, or the client gone: then the command
        goes as it would have (or, before "go", never begins)."""
        assert served.conn is not None
        try:
            message = served.conn.recv(64) if mask & select.POLLIN else b""
        except BlockingIOError:
            return
        except OSError:
            message = b""
        word, _, number = message.partition(b" ")
        if served.go is not None:
            if message == b"go":
                with contextlib.suppress(BrokenPipeError):  # it died before: its end is handed on as any
                    os.write(served.go, b"g")
            else:
                self.forget_client(served)
            os.close(served.go)  # unsaid, the child reads the end of the pipe and leaves
            served.go = None
        elif word == b"signal" and number.isdigit() and int(number) in FORWARDED:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(served.pidfd, int(number))
        elif not message:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(served.pidfd, signal.SIGKILL)
            self.forget_client(served)

    def forget_client(self, served: Served) -> None:
        if served.conn is not None:
            self.waiting.pop(served.conn.fileno(), None)
            with contextlib.suppress(KeyError, ValueError):  # (forget_fd may have unregistered it)
                self.poller.unregister(served.conn)
            served.conn.close()
            served.conn = None

    def ended(self, served: Served) -> None:
        try:
            _, status = os.waitpid(served.pid, 0)
        except ChildProcessError:  # reaped by someone else: its end is unknown, and not handed on
            status = None
        self.release(served)
        self.last = time.monotonic()
        if status is None:
            self.say(f"command {served.pid} for client {served.client}: its end unknown")
            self.forget_client(served)
            return
        reply = b"signal %d" % os.WTERMSIG(status) if os.WIFSIGNALED(status) else \
            b"exit %d" % os.waitstatus_to_exitcode(status)
        self.say(f"command {served.pid} for client {served.client}: {reply.decode()}"
                 + ("" if served.conn else " (the client went away)"))
        if served.conn is not None:
            with contextlib.suppress(OSError):
                served.conn.setblocking(True)
                served.conn.send(reply)
            self.forget_client(served)

    # --- the child ----------------------------------------------------------------------------

    def become(self, parent: int, conn: socket.socket, request: Request, fds: list[int], client: Profile,
               go_r: int, go_w: int) -> None:
        """In the child: drop the server's descriptors and handlers, wait for the client's
        "go" (without it the command never begins, and the client runs it itself), take
        the client's process state, and run the command. Leaves the process, whatever
        happens: it never returns into the server's code."""
        try:
            try:
                self._drop_the_server(parent, conn, go_w)
                if os.read(go_r, 1) != b"g":
                    os._exit(KILLED)  # the client went its own way: nothing ran
                os.close(go_r)
                self._take_the_client(request, fds, client)
            except BaseException:  # noqa: BLE001 - nothing of the command has run: say so, and leave
                with contextlib.suppress(Exception):
                    os.write(2, f"ccm-guard: error: the warm server could not start the command: "
                                f"{traceback.format_exc(limit=1)}".encode())
                os._exit(KILLED)
            self._run_as_the_interpreter_would()
        finally:
            os._exit(KILLED)

    def _drop_the_server(self, parent: int, conn: socket.socket, go_w: int) -> None:
        _libc().prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(KILLED)  # the server died before the line above
        os.close(go_w)
        conn.close()
        for served in self.children.values():
            os.close(served.pidfd)
            if served.go is not None:
                os.close(served.go)
            if served.conn is not None:
                served.conn.close()
        for other, _ in self.pending.values():
            other.close()
        self.listener.close()
        if self.spare >= 0:
            os.close(self.spare)
        signal.set_wakeup_fd(-1)
        for fd in self.pipe:
            os.close(fd)
        if self.log > 2:
            os.close(self.log)
        for signum in _STOPPING:  # as the interpreter leaves them: ignored stays ignored (as the client's)
            if signum not in self.ignored:
                signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
        if signal.SIGCHLD in self.ignored:
            signal.signal(signal.SIGCHLD, signal.SIG_IGN)

    @staticmethod
    def _take_the_client(request: Request, fds: list[int], client: Profile) -> None:
        os.setsid()  # no terminal of the server's (one run in the foreground has one), nor its group
        caller.CLIENT = client.pid  # the person's processes are found from the client (agent.processes)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        os.fchdir(fds[3])
        for fd in fds:
            os.close(fd)
        os.umask(client.umask)
        os.environb.clear()
        os.environb.update(request.env)
        time.tzset()  # the C library read TZ once, in the server
        sys.argv = [os.fsdecode(a) for a in request.argv]
        sys.path[:] = [os.fsdecode(p) for p in request.path]

    def _run_as_the_interpreter_would(self) -> None:
        """The command line's entry leaves the process itself; what escapes it ends the
        child as the interpreter ends a process: the traceback (or a non-numeric exit's
        text), other threads and exit handlers waited for, the streams flushed, and a
        KeyboardInterrupt's end by SIGINT."""
        code: object = 0
        interrupted = False
        try:
            self.run()
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:  # noqa: BLE001 - as the interpreter would: the traceback, then 1
            with contextlib.suppress(Exception):
                traceback.print_exc()
            code, interrupted = 1, isinstance(exc, KeyboardInterrupt)
        if code is not None and not isinstance(code, int):
            with contextlib.suppress(Exception):
                print(code, file=sys.stderr)
            code = 1
        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]
            atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code or 0)


def serve(*, run: Callable[[], None], preload: Iterable[str], idle: float, log: int) -> None:
    """Bind the name, import what commands need, and serve until idle or stopped.
    ServerError when the name is taken (a server runs) or a standard stream is missing."""
    if sys.stdin is None or sys.stdout is None or sys.stderr is None:
        raise ServerError("a standard stream is closed: the children would have none")
    for name in preload:  # first: a client that comes meanwhile finds no name, and runs its command itself
        with contextlib.suppress(ImportError):  # optional ones (re2)
            importlib.import_module(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        listener.bind(socket_name())
    except OSError as exc:
        listener.close()
        raise ServerError(f"a warm server already runs for this installation and state home ({exc.strerror})")
    listener.listen(64)
    server = Server(run=run, idle=idle, log=log, listener=listener)
    server.say(f"serving {PACKAGE} with {sys.executable}")
    server.loop()
    server.say(f"left after {server.served} command(s)")
