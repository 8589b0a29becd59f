"""The installed command's first step: hand the command to a warm server (server.py) when
one is running for this installation and state home, or say no in well under a millisecond
so that the command runs here as ever.

Only built-in modules are imported (not even `__future__`): the point is to skip Python's
start-up cost of click and ccm-guard's modules (some 45 ms of every command), so this
module must cost next to nothing itself, on both answers.

A command goes to the server only when nothing about it depends on being this process:
its three standard streams open, none a terminal, no controlling terminal (job control,
`SIGWINCH`, a pinentry reading /dev/tty would not reach a child of the server), and a
server of this user that is neither confined nor stopped (its `SO_PEERCRED` uid, and
`NoNewPrivs` and `State` in /proc: an agent in a sandbox may bind the name before the
server does, and must get none of the person's commands). The server checks the rest
(limits, cgroup, namespaces, scheduling, signal dispositions, the interpreter and its
path) and declines what differs. Until the server says the command started, anything
else (no answer within ACK_SECONDS, a reset, a refusal) leaves the command to run here,
and the server never starts it afterwards: its child waits for this client's "go".
"""

import os
import sys

import _signal  # type: ignore[import-not-found]  # loaded at every start; signal.py would import enum

TYPE_CHECKING = False  # typing's own costs a few milliseconds; mypy reads this name the same
if TYPE_CHECKING:
    import _socket

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OFF_VARIABLE = "CCM_GUARD_NO_SERVER"  # set (to anything, empty too): never use a warm server
SO_PEERPIDFD = 77  # Linux 6.5; every kernel with Landlock ABI 6, which the server needs, has it
SO_PEERCRED = 17
# What the client passes on to the command's child; the rest keep their default action.
FORWARDED = (1, 2, 3, 10, 12, 15)  # SIGHUP, SIGINT, SIGQUIT, SIGUSR1, SIGUSR2, SIGTERM
KILLED = 128 + 9  # the server vanished mid-command: the command was killed (errors.ExitCode.SERVER_GONE)
MAX_REQUEST = 200_000  # one datagram (the socket's default send buffer is ~208 KiB)
ACK_SECONDS = 1.0  # a server that has not started the command by then is passed by


def socket_name() -> bytes:
    """The abstract socket of the server for this user, installation and state home (the
    state home defaults to one under $HOME: HOME is part of the name too)."""
    env = os.environb
    key = b"\0".join((os.fsencode(PACKAGE), os.fsencode(sys.executable), env.get(b"CCM_GUARD_HOME", b""),
                      env.get(b"HOME", b"")))
    try:
        from _sha256 import sha256  # type: ignore[import-not-found]  # built in: hashlib costs more
    except ImportError:  # pragma: no cover - another interpreter build
        from hashlib import sha256
    return b"\0ccm-guard/%d/%s" % (os.getuid(), sha256(key).hexdigest()[:24].encode())


def request_fields() -> "list[bytes]":
    """What the server needs to become this command: the interpreter, the arguments, the
    environment and the import path (the rest it reads from /proc, or takes as fds)."""
    try:  # `setarch -R` and the like: the child and its agents must run under the same
        with open("/proc/self/personality", "rb") as f:
            personality = f.read()
    except OSError:
        personality = b"?"
    flags = repr((tuple(sys.flags), sys._xoptions, sys.warnoptions, personality)).encode()
    path = [os.fsencode(p) for p in sys.path]
    argv = [os.fsencode(a) for a in sys.argv]
    env = [k + b"=" + v for k, v in os.environb.items()]
    return [b"run", os.fsencode(sys.executable), sys.version.encode(), flags,
            b"%d" % len(argv), *argv, b"%d" % len(env), *env, b"%d" % len(path), *path]


def peer(sock: "_socket.socket") -> "tuple[int, int]":
    """The pid and uid of the process at the other end (as of its connect or listen)."""
    cred = sock.getsockopt(1, SO_PEERCRED, 12)  # SOL_SOCKET; struct ucred: pid, uid, gid
    return int.from_bytes(cred[0:4], sys.byteorder), int.from_bytes(cred[4:8], sys.byteorder)


def trusted_peer(sock: "_socket.socket") -> bool:
    """The server is this user's, not in a sandbox and not stopped; read through its
    pidfd, so that a process that died and left its pid to another cannot pass for it."""
    pid, uid = peer(sock)
    if uid != os.getuid():
        return False
    pidfd = sock.getsockopt(1, SO_PEERPIDFD)
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            text = status.read()
        _signal.pidfd_send_signal(pidfd, 0)  # still the process the pidfd names: ESRCH otherwise
        return not confined(text) and b"\nState:\tT" not in text and b"\nState:\tt" not in text
    finally:
        os.close(pidfd)


def confined(status: bytes) -> bool:
    """Whether a process, by its /proc/<pid>/status, is in a sandbox: every one sets
    no_new_privs (Landlock needs it)."""
    return b"\nNoNewPrivs:\t0\n" not in status


def _not_for_a_server() -> bool:
    """Switched off, a `server` command (it manages the server: it runs beside it), a
    stream closed (a socket opened now would take its number and pass for it), a stream
    on a terminal, or a controlling terminal."""
    if OFF_VARIABLE in os.environ or sys.argv[1:2] == ["server"]:
        return True
    try:
        if os.isatty(0) or os.isatty(1) or os.isatty(2):
            return True
        for fd in (0, 1, 2):
            os.fstat(fd)
    except OSError:
        return True
    try:
        os.close(os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY | os.O_CLOEXEC))
    except OSError:
        return False  # ENXIO: no controlling terminal
    return True


def through_server() -> "int | None":
    """The command's exit code, having had the warm server run it; None when it did not
    (no server, a terminal, or a server that declined or did not answer): run it here."""
    if _not_for_a_server():
        return None
    try:
        import _socket
    except ImportError:  # pragma: no cover - an interpreter without sockets
        return None
    # Non-blocking: a listener whose queue is full (one that never accepts) is no server.
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET | _socket.SOCK_CLOEXEC | _socket.SOCK_NONBLOCK)
    try:
        try:
            sock.connect(socket_name())
            if not trusted_peer(sock):
                return None
            sock.settimeout(ACK_SECONDS)
            data = b"\0".join(request_fields())
            if len(data) > MAX_REQUEST:
                return None
            cwd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fds = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2, cwd))
                sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, fds)])
            finally:
                os.close(cwd)
            if sock.recv(64) != b"started":  # a refusal, or the server going away: nothing ran
                return None
            sock.settimeout(None)
        except OSError:
            return None  # no server, a timeout, a reset: nothing ran, and nothing will
        return _go_and_wait(sock)
    finally:
        sock.close()


def _go_and_wait(sock: "_socket.socket") -> int:
    """Say "go", forward signals to the command, and wait for its end. The signals are
    held from before "go" until they are forwarded: one that came between would end
    this client and have the command killed instead of told."""

    def forward(signum: int, _frame: object) -> None:
        try:
            sock.send(b"signal %d" % signum)
        except OSError:
            pass  # the server is gone: the end of the command says so below

    held = _signal.pthread_sigmask(_signal.SIG_BLOCK, FORWARDED)
    previous = {}
    try:
        for signum in FORWARDED:
            if _signal.getsignal(signum) is not _signal.SIG_IGN:  # ignored stays ignored (the server compared)
                previous[signum] = _signal.signal(signum, forward)
        sock.send(b"go")  # from here the command is the server's to run
    except OSError:
        pass  # the server went at once: said below
    finally:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, held)
    try:
        reply = sock.recv(64)
    except OSError:
        reply = b""
    finally:
        for signum, handler in previous.items():
            _signal.signal(signum, handler)
    word, _, rest = reply.partition(b" ")
    if word == b"exit" and rest.isdigit():
        return int(rest)
    if word == b"signal" and rest.isdigit():
        signum = int(rest)
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # ended as the command did
        return 128 + signum
    os.write(2, b"ccm-guard: error: the warm server went away before the command finished (it may not have "
                b"begun): see `ccm-guard task list`, and `ccm-guard server status`; CCM_GUARD_NO_SERVER=1 runs "
                b"commands without it\n")
    return KILLED
