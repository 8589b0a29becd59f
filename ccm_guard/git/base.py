"""The bottom of the git gateway: the hardening, and git started with nothing but `os`.

`core` builds `run`, `Repo` and discovery on this. The guard hooks use it directly: a
hook is a fresh Python on every commit, and subprocess, dataclasses and pathlib would
cost it more than all of its git calls (docs/design-notes.md#lean-imports-on-the-hook-path).
So this module imports only `os` and `select`, and also holds the parsers of git's output
that the hooks share with the rest of the package.
"""

from __future__ import annotations

import gc
import os
import select
from itertools import repeat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Mapping, Sequence, TypeVar

    T = TypeVar("T", bound="tuple[object, ...]")

HARDENING = (
    "--no-pager",
    "--no-replace-objects",
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "core.commitGraph=false",
    "-c", "core.pager=cat",
    "-c", "core.editor=false",
    "-c", "sequence.editor=false",
    "-c", "commit.gpgSign=false",
    "-c", "tag.gpgSign=false",
    "-c", "log.showSignature=false",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "submodule.recurse=false",
    "-c", "core.askPass=",
    "-c", "credential.helper=",
    "-c", "advice.graftFileDeprecated=false",  # GIT_GRAFT_FILE=/dev/null below is deliberate
)

# A HOME under which nothing can ever exist: no ~/.gitconfig, no ~/.config/git/{ignore,
# attributes}, for anyone to plant (git takes ENOTDIR as absent, without a warning). A temp
# directory per process, as before, was left behind by every run and writable by the agent.
NO_HOME = "/dev/null"

# Where git finds the repository it is asked about. Dropped from the caller's environment
# (they would steer git elsewhere) unless passed on purpose as `locations`.
LOCATIONS = ("GIT_DIR", "GIT_COMMON_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


def environment(locations: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
                ) -> dict[str, str]:
    """The caller's environment without any GIT_* variable, the person's config or HOME,
    plus `locations` (git dir, work tree, index: see LOCATIONS) and `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.pop("XDG_CONFIG_HOME", None)
    env.update(
        HOME=NO_HOME,
        LC_ALL="C",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        GIT_ATTR_NOSYSTEM="1",
        GIT_GRAFT_FILE="/dev/null",
        GIT_NO_REPLACE_OBJECTS="1",
        GIT_OPTIONAL_LOCKS="0",
        GIT_TERMINAL_PROMPT="0",
        GIT_PAGER="cat",
        PAGER="cat",
    )
    env.update(locations or {})
    env.update(extra or {})
    return env


_found: list[str] = []


def binary() -> str:
    """The real git on PATH (links resolved), looked up once per process."""
    if not _found:
        for folder in os.get_exec_path():
            path = os.path.join(folder, "git")
            if os.path.isfile(path) and os.access(path, os.X_OK):
                _found.append(os.path.realpath(path))
                break
        else:
            from ccm_guard.errors import GitError

            raise GitError("git not found on PATH: install git (2.39 or newer) and try again")
    return _found[0]


def start(args: Sequence[str], *, cwd: str, env: Mapping[str, str], input: bytes = b""
          ) -> tuple[int, bytes, bytes]:
    """Run one hardened git command in `cwd` (git -C): (exit code, stdout, stderr).

    For the guard hooks' few calls; `core.run` (subprocess, timeouts) for everything else.
    """
    argv = [binary(), "-C", cwd, *HARDENING, "--literal-pathspecs", *args]
    fds = [os.pipe() for _ in range(3)]  # stdin, stdout, stderr; all close-on-exec
    (in_r, in_w), (out_r, out_w), (err_r, err_w) = fds
    try:
        pid = os.posix_spawn(argv[0], argv, dict(env), file_actions=[
            (os.POSIX_SPAWN_DUP2, in_r, 0), (os.POSIX_SPAWN_DUP2, out_w, 1), (os.POSIX_SPAWN_DUP2, err_w, 2)])
    except OSError as exc:
        for pair in fds:
            for fd in pair:
                os.close(fd)
        from ccm_guard.errors import GitError

        raise GitError(f"could not start git ({exc.strerror}): check that {argv[0]} works") from exc
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    out, err = _exchange(in_w, out_r, err_r, input)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), out, err


def _exchange(to_git: int, from_git: int, errors: int, data: bytes) -> tuple[bytes, bytes]:
    """Write `data` to git's stdin while reading its stdout and stderr (neither side can
    fill a pipe and wait on the other), until git closes both."""
    chunks: dict[int, list[bytes]] = {from_git: [], errors: []}
    poll = select.poll()
    for fd in chunks:
        poll.register(fd, select.POLLIN)
    if data:
        # Non-blocking: POLLOUT promises room for a little, not for all of a write; a
        # blocking write that waits for git to read while git waits for us to read its
        # output would never end.
        os.set_blocking(to_git, False)
        poll.register(to_git, select.POLLOUT)
    else:
        os.close(to_git)
    view, open_fds = memoryview(data), len(chunks) + bool(data)
    while open_fds:
        for fd, _ in poll.poll():
            if fd == to_git:
                try:
                    view = view[os.write(fd, view[:65536]):]
                except BlockingIOError:
                    continue  # the pipe filled up between poll and write
                except BrokenPipeError:
                    view = view[:0]  # git stopped reading (it exited): its exit code tells
                if not view:
                    poll.unregister(fd)
                    os.close(fd)
                    open_fds -= 1
                continue
            chunk = os.read(fd, 65536)
            if chunk:
                chunks[fd].append(chunk)
            else:
                poll.unregister(fd)
                os.close(fd)
                open_fds -= 1
    return b"".join(chunks[from_git]), b"".join(chunks[errors])


def describe(args: Sequence[str], code: int, stderr: bytes) -> str:
    """One line for a failed git call: the command, its exit code and git's last word."""
    lines = stderr.decode("utf-8", "replace").strip().splitlines()
    return f"git {' '.join(args)} failed (exit {code}): {lines[-1] if lines else 'no message'}"


# --- parsers of git's output, shared with the hooks ----------------------------------------

_NULL_IDS = frozenset(("0" * 40, "0" * 64))  # git's null id (no blob), SHA-1 and SHA-256
_NULL_DIGITS = "0" * 40  # in both null ids


def raw_changes(tokens: list[str], where: str, kind: type[T] = tuple) -> list[T]:  # type: ignore[assignment]
    """`git diff --raw -z` (and `log --raw -z` with `%x00commit %H` headers) output split on
    NUL, as (path, status, old mode, new mode, old blob, new blob, where) per path, a blob
    None for git's null id, each a `kind` (a tuple, or a namedtuple of those fields made
    directly: no second object per path); renames are off, so one path per entry."""
    return raw_changes_batched([tokens], where, kind)


def raw_changes_batched(batches: Iterable[list[str]], where: str, kind: type[T] = tuple  # type: ignore[assignment]
                        ) -> list[T]:
    """raw_changes of output that arrives in batches of whole tokens (core.run_z), each
    parsed as it comes.

    A range may change 100k paths: each run of entries (one commit's) is taken apart in
    slices and joins, C all the way, not token by token. git writes a commit's entries as
    meta, path, meta, path, ... up to an empty token (no path or meta is empty), then the
    next commit's header; a path is only ever read at a meta's odd offset, so a path named
    like a header or a meta is never taken for one. A run a batch ends inside is parsed up
    to its last whole entry, and the rest carried to the next batch.
    """
    found: list[T] = []
    carry: list[str] = []
    inside = False
    collecting = gc.isenabled()
    gc.disable()  # 100k new tuples would set off ever longer collections (more than doubling the time); none is a cycle
    try:
        for batch in batches:
            tokens = carry + batch if carry else batch
            done, where, inside = _parse_runs(found, tokens, where, kind, last=False, inside=inside)
            carry = tokens[done:]
        _parse_runs(found, carry, where, kind, last=True, inside=inside)
    finally:
        if collecting:
            if len(found) >= _MANY and not gc.get_freeze_count():
                # Straight into the oldest generation: the young one's next collection would
                # walk all 100k new tuples (18 ms) only to find them alive, as the caller keeps them.
                gc.freeze()
                gc.unfreeze()
            gc.enable()
    return found


_MANY = 10_000  # entries from which the collector is spared walking them


def _parse_runs(found: list[T], tokens: list[str], where: str, kind: type[T], *, last: bool, inside: bool
                ) -> tuple[int, str, bool]:
    """Append the entries of `tokens` to `found`: how many tokens were taken, the commit
    they were in, and whether a run of entries goes on past them. Unless this is the
    `last` of the output, a run not ended here is taken up to its last whole entry (a meta
    and its path); `inside` such a run, the next token is read as a meta (or its end),
    never as a header: where the output is cut decides nothing."""
    i, end_all = 0, len(tokens)
    while i < end_all:
        if not inside:
            token = tokens[i].lstrip("\n")
            if token.startswith("commit "):
                where = token[len("commit "):]
            if not token or token.startswith("commit "):
                i += 1
                continue
        elif not tokens[i]:  # the run ended where the previous batch did
            inside = False
            i += 1
            continue
        try:
            end = tokens.index("", i)
            inside = False
        except ValueError:
            end = end_all if last else i + (end_all - i) // 2 * 2
            inside = not last
            if end == i:
                break
        found += _entries(tokens[i:end:2], tokens[i + 1:end:2], where, kind)
        i = end
    return i, where, inside


def _entries(metas: list[str], paths: list[str], where: str, kind: type[T]) -> map[T]:
    """One commit's entries, from its metas (":OLDMODE NEWMODE OLDBLOB NEWBLOB STATUS",
    the first after a newline) and their paths.

    Each meta must have git's one shape, checked meta by meta at C speed: the colon and
    the single spaces where git puts them, so two six-digit modes, two ids of the
    object format's width and a one-letter status (renames are off: no score). A
    malformed meta is refused, never read off by one field, and a run checked in pieces
    (a batch ends inside it) is refused exactly where the whole run would be."""
    metas[0] = metas[0].removeprefix("\n")  # (a slice of the tokens: this parse's own list)
    width, count = len(metas[0]), len(metas)
    stride = width + 1  # a meta and the space that joins it to the next
    text = " ".join(metas)
    spaces = _SPACES.get(width, ())
    if not spaces or len(paths) != count or len(text) != stride * count - 1 or text.count(":") != count \
            or text.count(" ") != 5 * count - 1 or text[::stride] != ":" * count \
            or any(text[at::stride] != " " * (count if at < width else count - 1) for at in spaces):
        raise ValueError(f"unexpected raw diff output near {metas[0][:60]!r}")
    fields = text.replace(":", "").split(" ")
    olds: list[str | None] | list[str] | list[None] = fields[2::5]
    news: list[str | None] | list[str] | list[None] = fields[3::5]
    if _NULL_DIGITS in text:  # else no id is git's null id (one search, not a look at each)
        olds, news = _blobs(fields[2::5]), _blobs(fields[3::5])
    return map(tuple.__new__, repeat(kind), zip(paths, fields[4::5], fields[0::5], fields[1::5], olds, news,
                                               repeat(where)))


def _meta_spaces(oid_len: int) -> tuple[int, ...]:
    """Where the four spaces of a meta with ids `oid_len` hex digits long stand
    (":100644 100644 ID ID M"), and last, at its width, the one joining it to the next."""
    return 7, 14, 15 + oid_len, 16 + 2 * oid_len, 18 + 2 * oid_len


# A meta's width (SHA-1: 98, SHA-256: 146) -> where its spaces stand.
_SPACES = {spaces[-1]: spaces for spaces in (_meta_spaces(40), _meta_spaces(64))}


def _blobs(ids: list[str]) -> "list[str | None] | list[str] | list[None]":
    """Blob ids with git's null id as None, without a look at each where none or all are null."""
    for null in _NULL_IDS:
        count = ids.count(null)
        if count == len(ids):
            return [None] * count
        if count:
            return [None if oid in _NULL_IDS else oid for oid in ids]
    return ids


def batch_contents(out: bytes) -> dict[str, bytes]:
    """`git cat-file --batch` output: each object's content by id (missing ones left out)."""
    found: dict[str, bytes] = {}
    pos = 0
    while pos < len(out):
        header_end = out.index(b"\n", pos)
        oid, kind, *size = out[pos:header_end].decode().split(" ")
        start = header_end + 1
        if kind == "missing" or not size:
            pos = start
            continue
        found[oid] = out[start:start + int(size[0])]
        pos = start + int(size[0]) + 1
    return found
