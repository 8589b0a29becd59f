"""A directory as data, for the copied-directory strategy: copy it, record it, compare it.

The manifest maps each path (relative, "/"-separated) to its kind, mode, size, sha256 or
symlink target, and the stat identity of both the original and the copy when the copy
was made: any write changes inode, size, mtime or ctime, and ctime cannot be set back,
so a file whose identity still matches keeps its recorded digest and is not read again.
Two manifests are compared path by path (`diff`); `line_stats` has git count the lines.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Collection, Iterator, Mapping

from ccm_guard import git
from ccm_guard.clone import Cloner, copy_tree, digest_fd
from ccm_guard.errors import StateError
from ccm_guard.state.home import home
from ccm_guard.state.registry import COPIED_DIRECTORY, Task

STRATEGY = COPIED_DIRECTORY  # the strategy's name: in the task's options, its manifest and its verdict


@dataclasses.dataclass(frozen=True)
class Item:
    """One entry of a directory manifest."""

    kind: str  # "f" file, "l" symlink, "d" directory, "o" anything else (never copied)
    mode: int  # permission bits
    size: int
    digest: str | None  # a file's sha256, a symlink's target; None for the rest
    src: str = ""  # the original's stat identity when the copy was made
    copy: str = ""  # the copy's, right after it was made

    @classmethod
    def of(cls, kind: str, st: os.stat_result, digest: str | None, src: str = "", copy: str = "") -> "Item":
        return cls(kind, stat.S_IMODE(st.st_mode), st.st_size if kind == "f" else 0, digest, src, copy)


def same(a: Item | None, b: Item | None) -> bool:
    """Same content and mode (identities aside); two absent paths are the same."""
    if a is None or b is None:
        return a is b
    if a.kind != b.kind:
        return False
    if a.kind == "l":
        return a.digest == b.digest
    return a.mode == b.mode and (a.kind != "f" or a.digest == b.digest)


def _ident(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "f"
    if stat.S_ISLNK(mode):
        return "l"
    return "d" if stat.S_ISDIR(mode) else "o"


# Non-blocking: a path swapped for a FIFO since it was listed must not hang the judge.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _hash(path: Path) -> str:
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        return f"unreadable:{exc.errno}"  # differs from every digest: reported as changed
    try:
        st = os.fstat(fd)
        return digest_fd(fd, st.st_size) if stat.S_ISREG(st.st_mode) else "not-a-file"
    finally:
        os.close(fd)


# --- reading a tree --------------------------------------------------------------------------------


def walk(root: Path, unreadable: list[str] | None = None) -> Iterator[tuple[str, os.stat_result]]:
    """Every path under `root` (relative, "/"-separated) with its lstat; links not followed.

    A directory that cannot be listed raises, or with `unreadable` is noted there and
    skipped (the caller must then not trust the walk: an agent can chmod 000 a directory
    to hide what is in it).
    """
    stack = [("", root)]
    while stack:
        rel, directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError as exc:
            if unreadable is None:
                raise
            unreadable.append(f"{rel or '.'} ({exc.strerror})")
            continue
        for entry in entries:
            child = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed since it was listed (the person may be working there)
            yield child, st
            if stat.S_ISDIR(st.st_mode):
                stack.append((child, Path(entry.path)))


def observe(root: Path, base: Mapping[str, Item], side: str, unreadable: list[str] | None = None) -> dict[str, Item]:
    """The tree under `root` now. A file whose identity on `side` ("src" for the original,
    "copy" for the copy) is what the manifest recorded keeps its recorded digest; any
    other file is hashed."""
    return {rel: _item(root, rel, st, base.get(rel), side) for rel, st in walk(root, unreadable)}


def observe_one(root: Path, rel: str, known: Item | None, side: str) -> Item | None:
    try:
        st = os.lstat(root / rel)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return _item(root, rel, st, known, side)


def _item(root: Path, rel: str, st: os.stat_result, known: Item | None, side: str) -> Item:
    kind, ident = _kind(st.st_mode), _ident(st)
    digest = None
    if kind == "f":
        recorded = known is not None and known.kind == "f" and getattr(known, side) == ident
        digest = known.digest if recorded and known is not None else _hash(root / rel)
    elif kind == "l":
        try:
            digest = os.readlink(root / rel)
        except OSError as exc:
            digest = f"unreadable:{exc.errno}"  # replaced since it was listed: reported as changed
    return Item.of(kind, st, digest, src=ident if side == "src" else "", copy=ident if side == "copy" else "")


# --- copying and recording -------------------------------------------------------------------------


def copy_directory(source: Path, dest: Path) -> tuple[dict[str, Item], dict[str, int], list[str]]:
    """Copy `source` to `dest` (new) and return its manifest, how many files went which way,
    and the special files left out."""
    items: dict[str, Item] = {}
    counts: dict[str, int] = {}
    special: list[str] = []

    def visit(rel: str, kind: str, st: os.stat_result, how: str, digest: str | None,
              written: os.stat_result | None) -> None:
        counts[how] = counts.get(how, 0) + 1
        if not rel:
            return  # the top itself
        if kind == "o":
            special.append(rel)
        items[rel] = Item.of(kind, st, digest, src=_ident(st), copy=_ident(written) if written is not None else "")

    copy_tree(Cloner(), source, dest, visit, digest=True)
    return items, counts, special


def manifest_hash(items: Mapping[str, Item]) -> str:
    """One id for a tree's state (the task's "base" and "head")."""
    h = hashlib.sha256()
    for path in sorted(items):
        it = items[path]
        if it.kind != "o":
            h.update(f"{it.kind} {it.mode:o} {it.digest or ''} ".encode("utf-8", "surrogateescape"))
            h.update(path.encode("utf-8", "surrogateescape") + b"\0")
    return h.hexdigest()


def write_manifest(path: Path, source: Path, copy: Path, items: Mapping[str, Item]) -> None:
    # json escapes names that are not UTF-8 (surrogates) and reads them back as they were.
    data = {"version": 1, "strategy": STRATEGY, "source": str(source), "copy": str(copy),
            "items": {p: (i.kind, i.mode, i.size, i.digest, i.src, i.copy) for p, i in items.items()}}
    path.write_text(json.dumps(data))


def read_manifest(task: Task) -> dict[str, Item]:
    try:
        data = json.loads(Path(task.baseline or "").read_text())
        return {p: Item(*fields) for p, fields in data["items"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StateError(f"task {task.id}'s manifest {task.baseline} cannot be read ({exc}): "
                         "its copy cannot be compared; inspect it by hand") from exc


# --- comparing -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Change:
    """How one path differs between two manifests."""

    path: str
    status: str  # "A" added, "D" deleted, "M" content or mode, "T" kind changed
    before: Item | None
    after: Item | None


def diff(base: Mapping[str, Item], now: Mapping[str, Item], *, copied_only: bool = True) -> list[Change]:
    """What changed from `base` to `now`. For a copy (`copied_only`), special files are
    not there to compare: they were never copied, and one the agent makes is not applied."""
    changes = []
    for path in sorted(set(base) | set(now)):
        before, after = base.get(path), now.get(path)
        if copied_only:
            before = None if before is not None and before.kind == "o" else before
            after = None if after is not None and after.kind == "o" else after
        if same(before, after):
            continue
        if before is None:
            status = "A"
        elif after is None:
            status = "D"
        else:
            status = "T" if before.kind != after.kind else "M"
        changes.append(Change(path, status, before, after))
    return changes


def file_changes(changes: list[Change]) -> list[Change]:
    """The changes that are not only directories: directories are not paths the rules
    judge or lines are counted in (their files are); a directory that replaced a file
    counts as that file's deletion."""
    return [c for c in changes if not all(i is None or i.kind == "d" for i in (c.before, c.after))]


def line_stats(changes: list[Change], old_root: Path, new_root: Path,
               unknown: Collection[str] = ()) -> dict[str, tuple[int | None, int | None]]:
    """(added, deleted) lines per changed path, counted by git in one run over two scratch
    trees holding copies (reflinks where possible) of the old and the new files: the
    person's files and the task's copy are only read. A symlink counts as one line (its
    target), as in git. Paths in `unknown`, or whose files cannot be read, get no counts."""
    scratch = home() / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    unreadable = set(unknown)
    with tempfile.TemporaryDirectory(dir=scratch, prefix="numstat-") as tmp:
        old, new = Path(tmp, "a"), Path(tmp, "b")
        cloner = Cloner()
        for c in changes:
            if c.path in unreadable:
                continue
            try:
                _place(cloner, c.before, old_root / c.path, old / c.path)
                _place(cloner, c.after, new_root / c.path, new / c.path)
            except OSError:
                unreadable.add(c.path)
        old.mkdir(exist_ok=True)
        new.mkdir(exist_ok=True)
        counted = git.numstat_trees(old, new)
    return {c.path: (None, None) if c.path in unreadable else counted.get(c.path, (0, 0)) for c in changes}


def _place(cloner: Cloner, item: Item | None, src: Path, dst: Path) -> None:
    if item is None or item.kind not in ("f", "l"):
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    if item.kind == "l":
        dst.write_bytes((item.digest or "").encode("utf-8", "surrogateescape"))
    else:
        cloner.copy(src, dst)
