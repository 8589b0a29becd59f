"""Ref directories the sandbox keeps the agent out of, recorded by the directory's identity.

Under the sandbox the agent can write only its own branch's ref directory and that of its
reflogs (refs/heads/ccm/, logs/refs/heads/ccm/: prevent/roots.py). Every other directory
of `refs/` and `logs/refs/` is closed to it. A repository with 20k loose branches and
their reflogs cost most of a second to read twice per run, so a snapshot of a sandboxed
run keeps a closed directory by its identity (inode, mtime, change time) where it can:

- git changes a ref only by renaming a lock file into place, and creating, renaming or
  deleting an entry changes its directory's identity, which nobody can set back;
- the directory's listing (its subdirectories, its refs' values, its reflogs by inode,
  which git appends to in place) is kept in the state home under the listing's digest;
- a snapshot that finds a directory as listed there records only "<identity> <digest>"
  (`Snapshot.dirs`), and reads nothing in it; `expand` puts the two listings of a
  directory whose record changed back into the snapshots before they are compared.

A directory with fewer than `SMALL` entries, one changed in the last two seconds (a change
in the same clock tick as the read could keep its identity), or one with a lock file in it
(a change in flight) is listed in the snapshot itself, as every directory is without the
sandbox. Not seen in a closed directory: a file rewritten in place rather than replaced,
which only a process outside the sandbox can do and git does not do to a ref.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from ccm_guard.digest import sha256_hex

SMALL = 64  # fewer entries than this: cheaper to read each time than to keep
_SETTLE_NS = 2_000_000_000
TREES = ("refs", "logs/refs")


class Listing(NamedTuple):
    """One directory's entries as a snapshot records them."""

    subdirs: list[str]  # names
    entries: dict[str, Any]  # refs: "refs/<rel>" -> value; reflogs: "common/<rel>" -> [kind, mode, digest]
    locks: list[str]  # "common/<rel>" of lock files


Reader = Callable[[str, str], Listing]  # (rel, path) -> the directory's listing, read from its files


def store_dir() -> Path:
    from ccm_guard.state.home import home

    return home() / "refdirs"


class Closed:
    """The closed directories of one snapshot: which they are, and what the store holds."""

    def __init__(self, common: Path, open_dirs: tuple[str, ...]) -> None:
        self.common = common
        self.open_dirs = open_dirs
        self.dirs: dict[str, str] = {}  # recorded by identity: rel -> "<identity> <digest>"
        self._repo = sha256_hex(str(common).encode())[:16]
        self._index_path = store_dir() / f"{self._repo}.json"
        self._index: dict[str, list[Any]] | None = None
        self._added: dict[str, list[Any]] = {}

    def is_open(self, rel: str) -> bool:
        return any(rel == d or rel.startswith(d + "/") for d in self.open_dirs)

    def walk(self, top: str, reader: Reader) -> Iterator[tuple[str, Listing | None]]:
        """Every directory of the tree at `top` (rel to the common dir) down to the open
        ones: (rel, listing) for a closed one (empty where the store holds it), (rel, None)
        for an open one, which the caller reads in full with everything below it."""
        stack = [top]
        while stack:
            rel = stack.pop()
            if self.is_open(rel):
                yield rel, None
                continue
            found = self._listing(rel, reader)
            stack += [f"{rel}/{name}" for name in found.subdirs]
            yield rel, found

    def _listing(self, rel: str, reader: Reader) -> Listing:
        path = os.path.join(self.common, rel)
        try:
            st = os.lstat(path)
        except OSError:
            return Listing([], {}, [])  # gone, or never there: its parent's listing says so
        if not stat.S_ISDIR(st.st_mode):
            return Listing([], {}, [])
        ident = _identity(st)
        known = self._known().get(rel)
        if known and known[0] == ident and os.path.exists(store_dir() / f"{known[2]}.json"):
            self.dirs[rel] = f"{ident} {known[2]}"
            return Listing(list(known[1]), {}, [])
        started = time.time_ns()
        found = reader(rel, path)
        if len(found.entries) < SMALL or found.locks or st.st_ctime_ns > started - _SETTLE_NS:
            return found
        try:
            if _identity(os.lstat(path)) != ident:
                return found  # changed while read
            stem = _put(self._repo, found)
        except OSError:  # a full disk, a read-only home: listed in the snapshot as without the store
            return found
        self.dirs[rel] = f"{ident} {stem}"
        self._added[rel] = [ident, found.subdirs, stem]
        return Listing(found.subdirs, {}, [])

    def _known(self) -> dict[str, list[Any]]:
        if self._index is None:
            self._index = _load_index(self._index_path)
        return self._index

    def save(self) -> None:
        """Add the directories listed anew to the repository's index of listings (a
        concurrent run's additions may be lost: then a later snapshot reads those again).
        A listing the index no longer names goes once it is a day old: a run that began
        with it and is still going needs it to tell what changed."""
        if not self._added:
            return
        index = _load_index(self._index_path)
        replaced = [index[rel][2] for rel in self._added if rel in index and index[rel][2] != self._added[rel][2]]
        index.update(self._added)
        try:
            _write_atomic(self._index_path, json.dumps(index).encode())
        except OSError:
            return
        kept = {entry[2] for entry in index.values()}
        for stem in replaced:
            path = store_dir() / f"{stem}.json"
            try:
                if stem not in kept and os.lstat(path).st_mtime < time.time() - 86400:
                    os.unlink(path)
            except OSError:
                pass


def changed_listings(before: dict[str, str], after: dict[str, str]
                     ) -> tuple[dict[str, Listing | None], dict[str, Listing | None]]:
    """The listings, before and after, of the directories whose record changed between two
    snapshots' `dirs` (None: the listing is gone from the store, or not what was stored)."""
    changed = {rel for rel in {*before, *after} if before.get(rel) != after.get(rel)}
    return ({rel: load(before[rel]) for rel in changed if rel in before},
            {rel: load(after[rel]) for rel in changed if rel in after})


def unchanged_listings(before: dict[str, str], after: dict[str, str], refs: set[str]) -> dict[str, Listing | None]:
    """The listings of directories kept by identity in both snapshots alike that hold one
    of `refs`: a ref whose packed value changed while a loose file overrides it there, as
    git reads it, did not change."""
    rels = {ref.rsplit("/", 1)[0] for ref in refs}
    return {rel: load(before[rel]) for rel in rels if rel in before and before[rel] == after.get(rel)}


def load(record: str) -> Listing | None:
    """The listing a `dirs` record names, where its bytes still have that digest."""
    stem = record.rsplit(" ", 1)[-1]
    try:
        data = (store_dir() / f"{stem}.json").read_bytes()
    except OSError:
        return None
    if sha256_hex(data) != stem.rsplit("-", 1)[-1]:
        return None
    try:
        raw = json.loads(data)
        return Listing(list(raw["subdirs"]), dict(raw["entries"]), list(raw["locks"]))
    except (ValueError, KeyError, TypeError):
        return None


def _put(repo: str, found: Listing) -> str:
    """Store a listing (named by its repository and digest); its file's name."""
    data = json.dumps({"subdirs": found.subdirs, "entries": found.entries, "locks": found.locks},
                      sort_keys=True).encode()
    stem = f"{repo}-{sha256_hex(data)}"
    path = store_dir() / f"{stem}.json"
    if path.exists():
        os.utime(path)  # in use again: not old
    else:
        _write_atomic(path, data)
    return stem


def _identity(st: os.stat_result) -> str:
    return f"{st.st_ino}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _load_index(path: Path) -> dict[str, list[Any]]:
    try:
        index = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    if not isinstance(index, dict):
        return {}
    return {rel: v for rel, v in index.items()
            if isinstance(v, list) and len(v) == 3 and isinstance(v[1], list) and isinstance(v[2], str)}


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
