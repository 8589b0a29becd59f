"""Landlock: make the filesystem read-only for an agent except the roots it needs.

Used as `subprocess.Popen(..., preexec_fn=prepare(roots).enforce)`: the ruleset is built
in the parent, where a missing path or a refused rule is an ordinary GuardError with its
reason, and the child only does the two syscalls that cannot fail for a good ruleset
(an exception inside preexec_fn reaches the parent as a bare "Exception occurred in
preexec_fn", losing the reason). `restrict()` does both at once, for callers that are
already the process to confine.

Landlock only ever removes access: it cannot give the agent anything the uid lacks, and
it holds for root too (given no_new_privs). Every filesystem right the running kernel
knows is "handled", so an access not granted below is denied:

- everything: read, list and execute (the agent needs its tools, libraries and the repo);
- each writable root: every right, including REFER (ABI 2; without a rule granting it,
  any cross-directory rename or link is refused even when unhandled) and TRUNCATE (ABI 3);
- the terminal and the harmless character devices (/dev/null, /dev/tty, /dev/pts/...):
  write and truncate (`> /dev/null` opens with O_TRUNC), and IOCTL_DEV (ABI 5) on all of
  /dev, so a TUI can still ask for its window size and set raw mode.

With `no_network` (ABI 4), TCP bind and connect are refused, except to the ports the run
allows (an agent must still reach its model); UDP and Unix sockets are not covered by
Landlock's network rules. From ABI 6 the ruleset is also scoped: the agent can neither
connect to an abstract Unix socket nor signal a process outside its sandbox (the person's
D-Bus session, their other programs).
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import functools
import os
import platform
import stat
from pathlib import Path
from typing import NoReturn

from ccm_guard.errors import UsageError

# x86_64 and arm64 share these numbers (new syscalls are numbered alike on every
# architecture since 5.1, but only these two are tested here).
_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446), "arm64": (444, 445, 446)}
_PR_SET_NO_NEW_PRIVS = 38
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_RULE_NET_PORT = 2

# Filesystem rights, in ABI order.
EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1

_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_READ = EXECUTE | READ_FILE | READ_DIR
# Rights a rule on a non-directory may carry (the kernel refuses the others with EINVAL).
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV
# Device nodes an agent writes in normal work; the rest of /dev stays read-only, so root
# inside the sandbox still cannot write a disk through /dev/vda.
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom",
            "/dev/tty", "/dev/ptmx", "/dev/pts")


class _RulesetAttr(ctypes.Structure):
    # The kernel takes the size we pass, so fields past ABI 1 are simply zero on old kernels.
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _NetPort(ctypes.Structure):
    _pack_ = 1  # packed in the uapi header: 16 bytes
    _fields_ = [("allowed_access", ctypes.c_uint64), ("port", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1  # __attribute__((packed)) in the uapi header: 12 bytes, not 16
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _syscall(number: int, *args: object) -> int:
    fn = _libc().syscall
    fn.restype = ctypes.c_long
    return int(fn(ctypes.c_long(number), *args))


@functools.lru_cache(maxsize=1)
def abi() -> int:
    """The Landlock ABI version of the running kernel; 0 when Landlock cannot be used."""
    numbers = _SYSCALLS.get(platform.machine())
    if numbers is None:
        return 0
    version = _syscall(numbers[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    # ENOSYS: kernel built without it; EOPNOTSUPP: built in but not enabled at boot.
    return max(version, 0)


def describe() -> str:
    version = abi()
    if version:
        return f"landlock ABI {version}"
    machine = platform.machine()
    if machine not in _SYSCALLS:
        return f"landlock unsupported on {machine}"
    return "landlock unavailable (kernel without Landlock, or not enabled with lsm=...,landlock)"


def _fs_rights(version: int) -> int:
    return _FS_BY_ABI[min(version, max(_FS_BY_ABI))]


@dataclasses.dataclass
class Ruleset:
    """A built ruleset, waiting to be enforced in the child right before exec."""

    fd: int
    version: int
    # Looked up now: the child between fork and exec should do as little Python as it can.
    restrict_nr: int = dataclasses.field(default_factory=lambda: _SYSCALLS[platform.machine()][2])

    def enforce(self) -> None:
        """prctl(NO_NEW_PRIVS) then landlock_restrict_self; for preexec_fn.

        no_new_privs comes first because the kernel refuses restrict_self without it
        (unless CAP_SYS_ADMIN), and it also stops a setuid binary from escaping.
        """
        libc = _libc()
        # unsigned long arguments: the kernel refuses NO_NEW_PRIVS unless args 3-5 are 0.
        args = (ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        if libc.prctl(ctypes.c_int(_PR_SET_NO_NEW_PRIVS), *args) != 0:
            _raise("prctl(PR_SET_NO_NEW_PRIVS)")
        if _syscall(self.restrict_nr, ctypes.c_int(self.fd), ctypes.c_uint32(0)) != 0:
            _raise("landlock_restrict_self")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def prepare(writable: list[Path], *, no_network: bool = False, allow_ports: tuple[int, ...] = ()) -> Ruleset:
    """Build (in the calling process) a ruleset: all readable, writes only beneath `writable`;
    with `no_network`, TCP connect only to `allow_ports` and no bind."""
    version = abi()
    if version == 0:
        raise UsageError(f"--sandbox landlock is not available here ({describe()}): "
                         "run without --sandbox, or with --sandbox auto")
    if no_network and version < 4:
        raise UsageError(f"--no-network needs Landlock ABI 4 or newer, this kernel has {version}: "
                         "drop --no-network or use a newer kernel")
    fs = _fs_rights(version)
    attr = _RulesetAttr(fs, NET_BIND_TCP | NET_CONNECT_TCP if no_network else 0,
                        SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if version >= 6 else 0)
    # The kernel refuses a larger struct than its ABI knows (E2BIG) unless the rest is zero;
    # pass exactly the fields this ABI has.
    size = 8 * (3 if version >= 6 else 2 if version >= 4 else 1)
    fd = _syscall(_SYSCALLS[platform.machine()][0], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        _raise("landlock_create_ruleset")
    ruleset = Ruleset(fd, version)
    try:
        _add(ruleset, Path("/"), _READ)
        for device in _DEVICES:
            if os.path.exists(device):
                _add(ruleset, Path(device), READ_FILE | WRITE_FILE | TRUNCATE)
        _add(ruleset, Path("/dev"), IOCTL_DEV & fs)
        for root in writable:
            _add(ruleset, root, fs)
        if no_network:
            for port in allow_ports:
                rule = _NetPort(NET_CONNECT_TCP, port)
                if _syscall(_SYSCALLS[platform.machine()][1], ctypes.c_int(ruleset.fd), ctypes.c_int(_RULE_NET_PORT),
                            ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
                    _raise(f"landlock_add_rule for TCP port {port}")
    except BaseException:
        ruleset.close()
        raise
    return ruleset


def restrict(writable: list[Path], *, no_network: bool = False, allow_ports: tuple[int, ...] = ()) -> None:
    """Confine the calling process (and what it execs) to writing beneath `writable`.

    Landlock confines the calling thread only: call it where there is one thread, in a
    child between fork and exec.
    """
    ruleset = prepare(writable, no_network=no_network, allow_ports=allow_ports)
    try:
        ruleset.enforce()
    finally:
        ruleset.close()


def _add(ruleset: Ruleset, path: Path, access: int) -> None:
    if not access:
        return  # e.g. IOCTL_DEV before ABI 5: nothing to grant, nothing handled
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as exc:
        raise UsageError(f"cannot sandbox with {path} writable ({exc.strerror}): create it or leave it out") from exc
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            access &= _FILE_RIGHTS
        rule = _PathBeneath(access & _fs_rights(ruleset.version), fd)
        if _syscall(_SYSCALLS[platform.machine()][1], ctypes.c_int(ruleset.fd), ctypes.c_int(_RULE_PATH_BENEATH),
                    ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            _raise(f"landlock_add_rule for {path}")
    finally:
        os.close(fd)


def _raise(what: str) -> NoReturn:
    err = ctypes.get_errno()
    raise UsageError(f"{what} failed ({os.strerror(err)} [{errno.errorcode.get(err, err)}]): "
                     "run without --sandbox landlock, or report this kernel's behaviour")


def reachable_sockets(cap: int = 64) -> list[str]:
    """Unix sockets on the file system of the person's own servers, those that run
    commands first: the ones their session's variables name (tmux, the D-Bus session bus,
    ssh-agent, docker), then what is in the places such servers keep them (tmux's
    directory, $XDG_RUNTIME_DIR or /run/user/<uid> when it is the user's own 0700
    directory, as a runtime dir is; docker's). Landlock cannot refuse a connection to a
    socket file (only its creation), so a server there can run commands outside the
    sandbox. Owned by this user (docker's: writable by them); at most `cap`."""
    uid = os.getuid()
    env = os.environ
    docker = env.get("DOCKER_HOST", "")
    named = [env.get("TMUX", "").split(",")[0], *_dbus_paths(env.get("DBUS_SESSION_BUS_ADDRESS", "")),
             env.get("SSH_AUTH_SOCK", ""), docker[len("unix://"):] if docker.startswith("unix://") else ""]
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{uid}"
    places = [os.path.join(env.get("TMUX_TMPDIR") or "/tmp", f"tmux-{uid}")]
    if _private_dir(runtime, uid):  # not a shared /tmp that a CI sets it to
        places += [os.path.join(runtime, d) for d in ("systemd", "podman", "docker")] + [runtime]
        places += [p for p in _subdirs(runtime, _names(runtime)) if p not in places]
    candidates = [p for p in named if p] + [os.path.join(place, name) for place in places for name in _names(place)]
    found = [path for path in ("/run/docker.sock", "/var/run/docker.sock")
             if _is_socket(path) and os.access(path, os.W_OK)][:1]
    for path in dict.fromkeys(candidates):
        if len(found) < cap and path not in found and _is_socket(path, owner=uid):
            found.append(path)
    return found


def _dbus_paths(address: str) -> list[str]:
    """The socket files a D-Bus address names: `unix:path=/x/bus,guid=...;...`, the path
    %-escaped as D-Bus escapes it."""
    found = []
    for part in address.split(";"):
        if part.startswith("unix:"):
            for key, _, value in (kv.partition("=") for kv in part[len("unix:"):].split(",")):
                if key == "path":
                    found.append(_unescape(value))
    return found


def _unescape(value: str) -> str:
    parts = value.split("%")
    out = [parts[0]]
    for part in parts[1:]:
        try:
            out.append(chr(int(part[:2], 16)) + part[2:])
        except ValueError:
            out.append("%" + part)
    return "".join(out)


def _private_dir(path: str, uid: int) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def _names(directory: str, limit: int = 512) -> list[str]:
    """Up to `limit` names in `directory` (a runtime dir holds a few dozen)."""
    try:
        with os.scandir(directory) as it:
            return sorted(entry.name for entry, _ in zip(it, range(limit)))
    except OSError:
        return []


def _subdirs(directory: str, names: list[str]) -> list[str]:
    """Those of `names` that are directories in `directory` (links not followed), as paths."""
    paths = [os.path.join(directory, n) for n in names]
    return [p for p in paths if os.path.isdir(p) and not os.path.islink(p)]


def _is_socket(path: str, owner: int | None = None) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISSOCK(st.st_mode) and (owner is None or st.st_uid == owner)
