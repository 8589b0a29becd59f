"""The index: reading an index file directly (how many files, how many bytes, whether its
racily clean entries are provably unchanged), and the git calls that read or write an
index, the work tree's own or a private index file.

`sizes` is used only to estimate what a checkout will write (the disk-space preflight):
asking git for every blob's size opens every object (1.5 s at 100k files here), while
the person's index already records each file's size (about 50 ms to read).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterator, Sequence

from ccm_guard.digest import hasher
from ccm_guard.files import read_regular
from ccm_guard.git.core import Repo, run


def sizes(path: Path, oid_len: int = 20) -> tuple[int, int] | None:
    """(entries, total size) recorded in an index file, or None if it cannot be read."""
    try:
        data = path.read_bytes()
        steps = _steps(data, oid_len)
        if steps is None:
            return None
        count, total = 0, 0
        for pos, *_ in steps:
            total += struct.unpack_from(">I", data, pos + _SIZE_AT)[0]
            count += 1
    except (OSError, ValueError, IndexError, struct.error):
        return None
    return count, total


def entry_count(path: Path) -> int | None:
    """How many entries an index file's header counts (its first 12 bytes, nothing else
    read); None where it is no index."""
    header = _header(read_regular(path, 12) or b"")
    return header[1] if header else None


def _header(data: bytes) -> tuple[int, int] | None:
    """An index file's version and entry count, from its first 12 bytes; None for what is
    no index."""
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack(">II", data[4:12])
    return version, count


_ENTRY = struct.Struct(">10I")  # ctime s, ns, mtime s, ns, dev, ino, mode, uid, gid, size
_MTIME_AT, _SIZE_AT = 8, 36  # the mtime's seconds and the size: their offsets in an entry
Entry = tuple[int, tuple[int, ...], int, bytes]  # offset, stat fields, flags, path


def entries(data: bytes, oid_len: int = 20, *, since: int = 0) -> list[Entry] | None:
    """An index file's entries whose mtime is in second `since` or later (all by default),
    as (offset, stat fields, flags, path); None for what this does not read: not an index
    of version 2 to 4, one whose entries and extensions do not add up to the file, or a
    split or sparse index (whose entries are not all in the file)."""
    steps = _steps(data, oid_len)
    if steps is None:
        return None
    found: list[Entry] = []
    after = 12  # where the entries end and the extensions begin
    try:
        for pos, flags, start, path, after in steps:
            if struct.unpack_from(">I", data, pos + _MTIME_AT)[0] >= since:
                whole = data[start:path] if isinstance(path, int) else path
                found.append((pos, _ENTRY.unpack_from(data, pos), flags, whole))
        while after + 8 <= len(data) - oid_len:  # the extensions, until the trailing checksum
            if data[after:after + 4] in (b"link", b"sdir"):
                return None
            after += 8 + struct.unpack_from(">I", data, after + 4)[0]
    except (ValueError, IndexError, struct.error):
        return None
    return found if after == len(data) - oid_len else None


def _steps(data: bytes, oid_len: int) -> Iterator[tuple[int, int, int, bytes | int, int]] | None:
    """The entries of an index file of version 2 to 4 as (offset, flags with the extended
    ones as their upper half, where its name starts, the path (version 4) or where the
    name ends, where the next entry begins); None for another file. A name is not copied
    out where it lies whole in the file: a step over 100k entries costs ~25 ms, not ~40.
    Iterating raises ValueError where the file contradicts itself."""
    header = _header(data)
    if header is None or header[0] not in (2, 3, 4):
        return None
    version, count = header

    def walk() -> Iterator[tuple[int, int, int, bytes | int, int]]:
        pos, fixed, path = 12, 40 + oid_len + 2, b""
        for _ in range(count):
            flags, head = struct.unpack_from(">H", data, pos + fixed - 2)[0], fixed
            if version >= 3 and flags & 0x4000:  # extended flags follow, as their upper half
                flags |= struct.unpack_from(">H", data, pos + fixed)[0] << 16
                head += 2
            length = flags & 0xFFF  # the name's length, or 0xFFF for "as long as or longer"
            if version == 4:  # the last path, less as many bytes as a varint says, then the rest
                strip, at = _varint(data, pos + head)
                end = data.index(b"\0", at)
                if strip > len(path):
                    raise ValueError("an entry strips more than the last path")
                path = path[:len(path) - strip] + data[at:end]
                if length < 0xFFF and len(path) != length:  # as git, which stops there
                    raise ValueError("an entry's path is not as long as its flags say")
                yield pos, flags, at, path, end + 1
                pos = end + 1
            else:
                end = pos + head + length if length < 0xFFF else data.index(b"\0", pos + head)
                if data[end] != 0:
                    raise ValueError("an entry's name does not end where its flags say")
                following = pos + ((end - pos + 8) & ~7)
                yield pos, flags, pos + head, end, following
                pos = following

    return walk()


def _varint(data: bytes | bytearray, pos: int) -> tuple[int, int]:
    """git's offset varint at `pos` (each continued byte adds one before the shift): the
    value and the position after it."""
    byte = data[pos]
    value = byte & 0x7F
    while byte & 0x80:
        pos += 1
        byte = data[pos]
        value = ((value + 1) << 7) | (byte & 0x7F)
    return value, pos + 1


_ASSUMED, _SKIPPED = 0x8000, 0x4000 << 16  # assume-valid; skip-worktree (an extended flag)
_GITLINK = 0o160000


def trust_unchanged(index: Path, work_tree: Path, *, written_before_ns: int, oid_len: int = 20) -> int | None:
    """Let git trust the stat data of the index file `index` where its racily clean
    entries are proven unchanged, and read the rest; returns the mtime (ns) it gave the
    file, or None when it changed nothing.

    git compares stat data in whole seconds and so cannot trust an entry written in the
    same second as the index ("racily clean"): after a fresh checkout that is every file,
    and git reads them all again on every status (50 ms at 10k files, seconds at 100k).
    An entry is proven unchanged when its file is as the entry records it to the
    nanosecond (change time, mtime, inode, size, type) and the entry's change time is
    before `written_before_ns` (before anyone else could write into the work tree): any
    write since gives the file a later change time, which no one can set back. Nothing
    else is assumed of clocks: not that two of them agree, not that one never goes back.
    Each racily clean entry not proven is smudged as git itself does it (size 0: git
    reads the file); then the file's mtime moves past every entry, so git trusts the
    others. An index with a racily clean entry flagged (assume-unchanged, skip-worktree),
    or one this does not read, is left as it is: git reads every racily clean file, as
    ever."""
    try:
        original = index.read_bytes()
        since = os.stat(index).st_mtime_ns // 1_000_000_000
    except OSError:
        return None
    racy = entries(original, oid_len, since=since)  # the rest git trusts anyway
    if not racy or any(flags & (_ASSUMED | _SKIPPED) for _, _, flags, _ in racy):
        return None
    data, base, latest = bytearray(original), os.fsencode(work_tree) + b"/", since
    for pos, (ctime_s, ctime_ns, mtime_s, mtime_ns, _, ino, mode, _, _, size), _, path in racy:
        if mode == _GITLINK:  # a submodule is not stat-compared
            continue
        latest = max(latest, mtime_s)
        if not _proven(base + path, ctime=ctime_s * 1_000_000_000 + ctime_ns,
                       mtime=mtime_s * 1_000_000_000 + mtime_ns, ino=ino, mode=mode, size=size,
                       before=written_before_ns):
            data[pos + _SIZE_AT:pos + _SIZE_AT + 4] = bytes(4)
    if any(data[-oid_len:]):  # the checksum (all zeros where git was told to skip it)
        checksum = hasher("sha1" if oid_len == 20 else "sha256", len(data))
        checksum.update(data[:-oid_len])
        data[-oid_len:] = checksum.digest()
    mark = (latest + 1) * 1_000_000_000
    try:
        index.write_bytes(data)
        os.utime(index, ns=(mark, mark))
    except OSError:
        return None
    return mark


def _proven(path: bytes, *, ctime: int, mtime: int, ino: int, mode: int, size: int, before: int) -> bool:
    """The file at `path` is as an index entry with these stat data recorded it, to the
    nanosecond, and was last changed before `before` (ns). A file system that keeps no
    nanoseconds proves nothing."""
    if ctime >= before or not (ctime % 1_000_000_000 or mtime % 1_000_000_000):
        return False
    try:
        st = os.lstat(path)
    except OSError:  # gone, or a directory on its way became a file
        return False
    return (st.st_ctime_ns == ctime and st.st_mtime_ns == mtime and st.st_ino & 0xFFFFFFFF == ino
            and st.st_size & 0xFFFFFFFF == size and not (st.st_mode ^ mode) & 0o170000)


def reset_index(repo: Repo, rev: str) -> None:
    """The work tree's own index to `rev`, its files untouched (`git reset --mixed`)."""
    run(["read-tree", "--reset", rev], repo)


def index_tree(repo: Repo, index: Path) -> str | None:
    """The tree an index file describes (what was staged there), or None when git cannot
    write one from it (unmerged entries, missing objects, not an index at all)."""
    res = run(["write-tree"], repo, env={"GIT_INDEX_FILE": str(index)}, check=False)
    return res.out.strip() if res.returncode == 0 else None


# A private index over a work tree (recovery commits on the agent's behalf with one, so the
# agent's staging plays no part). Unlike the pool's (checkout.py), it keeps the task's own
# sparse settings.


def index_from(repo: Repo, index: Path, rev: str) -> None:
    """Make the index file `index` hold exactly `rev`'s tree (its stat cache kept, if any)."""
    run(["read-tree", "--reset", rev], repo, env={"GIT_INDEX_FILE": str(index)})


def changed_with_index(repo: Repo, index: Path) -> list[str]:
    """Paths whose work-tree state differs from HEAD in the index file `index`, plus
    untracked files that are not ignored."""
    env = {"GIT_INDEX_FILE": str(index)}
    # Refresh first: diff-index reports every entry whose stat data is stale as changed.
    run(["update-index", "-q", "--refresh", "--ignore-submodules"], repo, env=env, check=False)
    tracked = run(["diff-index", "-z", "--name-only", "--no-renames", "HEAD", "--"], repo, env=env).z()
    untracked = run(["ls-files", "-z", "--others", "--exclude-standard", "--"], repo, env=env).z()
    # A nested repository is listed as "dir/"; update-index wants the path without it.
    return sorted(set(tracked) | {p.rstrip("/") for p in untracked})


def stage_with_index(repo: Repo, index: Path, paths: Sequence[str]) -> str:
    """Record the work tree's state of `paths` in the index file `index`; its tree id.
    update-index takes the paths literally from stdin (no pathspec magic, no argv limit),
    --add for new files, --remove for deleted ones."""
    env = {"GIT_INDEX_FILE": str(index)}
    data = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    run(["update-index", "--add", "--remove", "-z", "--stdin"], repo, env=env, input=data)
    return run(["write-tree"], repo, env=env).out.strip()
