"""Snapshots of a task's git metadata, read straight from the files.

The agent controls every file inside the repository, including the ones that tell git
where the repository is and what to run. So a snapshot never asks git: it walks the
pinned directories with no-follow opens, before any git command runs after the agent,
and records for each file its type, mode and a content hash (or, for the object store
and large files, an identity that any write changes: inode, size, mtime and ctime).
References are parsed from `packed-refs` and the loose ref files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import time
from pathlib import Path
from typing import Any, Collection, Iterator

from . import objects

HASH_LIMIT = 1 << 20  # larger files are tracked by identity, not content
# An index is hashed even when large: its content, not its timestamp, tells whether a git
# command ran in that worktree (`touch index` must not pass for one).
INDEX_HASH_LIMIT = 1 << 26
CONTENT_LIMIT = 1 << 16  # config-like files whose bytes we keep to report key by key

# Where the common dir's own walk does not go: objects are inventoried separately,
# refs are parsed, and lock/temporary files are transient by nature.
_SKIP_TOP = {"objects", "refs", "packed-refs"}


@dataclasses.dataclass(frozen=True)
class Pins:
    """Absolute paths recorded when the task was created, before the agent existed."""

    worktree: Path
    admin_dir: Path
    common_dir: Path
    branch: str  # the task's branch, short name (ccm/<task>)

    @property
    def admin_name(self) -> str:
        return self.admin_dir.name

    @property
    def branch_ref(self) -> str:
        return f"refs/heads/{self.branch}"


@dataclasses.dataclass(frozen=True)
class Entry:
    kind: str  # "f" file, "d" directory, "l" symlink, "o" anything else
    mode: int
    digest: str  # sha256 of a file's bytes, a symlink's target, or "id:<ino>:<size>:<mtime>:<ctime>"


@dataclasses.dataclass
class Snapshot:
    files: dict[str, Entry]  # "common/<rel>" and "pointer" (the worktree's .git file)
    contents: dict[str, bytes]  # the bytes of config files, for key-by-key reports
    refs: dict[str, str]  # refname -> "<sha>" or "ref: <target>" or "symlink: <target>"
    objects: dict[str, tuple[int, int, int, int]]  # rel path under objects/ -> identity
    taken_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "files": {k: [e.kind, e.mode, e.digest] for k, e in self.files.items()},
            "contents": {k: v.decode("utf-8", "surrogateescape") for k, v in self.contents.items()},
            "refs": self.refs,
            "objects": {k: list(v) for k, v in self.objects.items()},
            "taken_at": self.taken_at,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Snapshot":
        return cls(
            files={k: Entry(v[0], v[1], v[2]) for k, v in data["files"].items()},
            contents={k: v.encode("utf-8", "surrogateescape") for k, v in data["contents"].items()},
            refs=dict(data["refs"]),
            objects={k: (v[0], v[1], v[2], v[3]) for k, v in data["objects"].items()},
            taken_at=data["taken_at"],
        )


def take(pins: Pins, extra_files: tuple[Path, ...] = ()) -> Snapshot:
    """Capture everything DESIGN.md § Detection lists. Pure file reads; no git."""
    files: dict[str, Entry] = {}
    contents: dict[str, bytes] = {}
    common = pins.common_dir
    own = f"worktrees/{pins.admin_name}/"
    for rel, entry, data in _walk(common, skip_top=_SKIP_TOP):
        if rel.endswith(".lock") and not rel.startswith(own):
            continue  # another git process at work right now; only the task's own locks are its doing
        key = f"common/{rel}"
        files[key] = entry
        if data is not None and _is_config(rel):
            contents[key] = data
    for name in ("objects/info",):
        for rel, entry, data in _walk(common / name):
            files[f"common/{name}/{rel}"] = entry
    pointer = _read_entry(pins.worktree / ".git")
    if pointer is not None:
        files["pointer"] = pointer[0]
        if pointer[1] is not None:
            contents["pointer"] = pointer[1]
    for path in extra_files:  # include targets, outside the repository
        found = _read_entry(path)
        files[f"include/{path}"] = found[0] if found else Entry("-", 0, "")
        if found and found[1] is not None:
            contents[f"include/{path}"] = found[1]
    return Snapshot(files, contents, read_refs(common), objects.inventory(common / "objects"), time.time())


def _is_config(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.startswith("config") or name in ("HEAD", "commondir", "gitdir")


def _walk(root: Path, skip_top: Collection[str] = ()) -> Iterator[tuple[str, Entry, bytes | None]]:
    """Every entry below `root`, without following symlinks, as (relative path, entry, bytes)."""
    stack = [("", root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with it:
            for dent in it:
                rel = prefix + dent.name
                if not prefix and dent.name in skip_top:
                    continue
                # Object stores (submodules', git-lfs') are tracked by identity: hashing
                # gigabytes twice per run would dwarf the run itself.
                found = _read_entry(Path(dent.path), by_identity="objects/" in rel or rel.startswith("lfs/"))
                if found is None:
                    continue
                entry, data = found
                yield rel, entry, data
                if entry.kind == "d":
                    stack.append((rel + "/", Path(dent.path)))


def _read_entry(path: Path, by_identity: bool = False) -> tuple[Entry, bytes | None] | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        return Entry("d", mode, ""), None
    if stat.S_ISLNK(st.st_mode):
        return Entry("l", mode, os.readlink(path)), None
    if not stat.S_ISREG(st.st_mode):
        return Entry("o", mode, f"type:{stat.S_IFMT(st.st_mode)}"), None
    if by_identity or st.st_size > (INDEX_HASH_LIMIT if path.name == "index" else HASH_LIMIT):
        return Entry("f", mode, identity(st)), None
    data = read_nofollow(path)
    if data is None:
        return None
    return Entry("f", mode, hashlib.sha256(data).hexdigest()), data if len(data) <= CONTENT_LIMIT else None


def identity(st: os.stat_result) -> str:
    # ctime cannot be set back by an unprivileged process: a rewrite always shows.
    return f"id:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def read_nofollow(path: Path) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return b""
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def read_refs(common: Path) -> dict[str, str]:
    """All refs of the common dir: packed first, loose ones override (as git reads them)."""
    refs: dict[str, str] = {}
    packed = read_nofollow(common / "packed-refs") or b""
    for line in packed.decode("utf-8", "surrogateescape").splitlines():
        if not line or line[0] in "#^":
            continue
        sha, _, name = line.partition(" ")
        refs[name] = sha
    for rel, entry, data in _walk(common / "refs"):
        if rel.endswith(".lock"):
            continue  # a ref update in flight, not a ref (git reads them the same way)
        name = f"refs/{rel}"
        if entry.kind == "l":
            refs[name] = f"symlink: {entry.digest}"
        elif entry.kind == "f":
            text = (data or b"").decode("utf-8", "surrogateescape").strip()
            refs[name] = text if text.startswith("ref: ") else text[:64]
        elif entry.kind != "d":
            refs[name] = f"other: {entry.digest}"
    return refs
