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
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from ccm_guard.digest import sha256_hex
from ccm_guard.files import replace_file

SMALL = 64  # fewer entries than this: cheaper to read each time than to keep
_SETTLE_NS = 2_000_000_000
_UNUSED_FOR = 7 * 86400  # a listing no snapshot used for this long, and the index no longer names, goes
_STEM = re.compile(r"[0-9a-f]{16}-[0-9a-f]{64}")


class Listing(NamedTuple):
    """One directory's entries as a snapshot records them, read from its files."""

    subdirs: list[str]  # names
    entries: dict[str, Any]  # refs: "refs/<rel>" -> value; reflogs: "common/<rel>" -> [kind, mode, digest]
    locks: list[str]  # "common/<rel>" of lock files
    idents: dict[str, str]  # entry -> its file's identity, by which the next reading reuses its entry
    taken_at: float = 0.0

    def reusable(self, key: str, ident: str) -> Any:
        """The entry recorded for `key` if its file is as this listing saw it: the same
        identity, last changed two seconds or more before it was read (else None)."""
        if self.idents.get(key) != ident or int(ident.rsplit(":", 1)[1]) >= self.taken_at * 1e9 - _SETTLE_NS:
            return None
        return self.entries.get(key)


# (rel, path, an earlier listing of it to reuse entries from) -> the directory's listing
Reader = Callable[[str, str, "Listing | None"], Listing]


def store_dir() -> Path:
    from ccm_guard.state.home import home

    return home() / "refdirs"


class Closed:
    """The closed directories of one snapshot: which they are, and what the store holds."""

    def __init__(self, common: Path, open_dirs: tuple[str, ...]) -> None:
        self.common = common
        self.open_dirs = open_dirs
        self.dirs: dict[str, str] = {}  # recorded by identity: rel -> "<identity> <listing>"
        self._repo = sha256_hex(str(common).encode())[:16]
        self._index_path = store_dir() / f"{self._repo}.json"
        self._index: dict[str, list[Any]] | None = None
        self._added: dict[str, list[Any]] = {}

    def is_open(self, rel: str) -> bool:
        return any(rel == d or rel.startswith(d + "/") for d in self.open_dirs)

    def walk(self, top: str, reader: Reader) -> Iterator[tuple[str, Listing | None]]:
        """Every closed directory of the tree at `top` (rel to the common dir) as (rel,
        listing), empty where the store holds it; then each open directory in it as (rel,
        None), for the caller to read in full with everything below it. The open ones are
        found by their own names, never through what the store says of their parents."""
        stack = [top]
        while stack:
            rel = stack.pop()
            found = self._listing(rel, reader)
            stack += [f"{rel}/{name}" for name in found.subdirs if not self.is_open(f"{rel}/{name}")]
            yield rel, found
        for rel in self.open_dirs:
            if rel.startswith(top + "/") and not any(rel.startswith(d + "/") for d in self.open_dirs):
                yield rel, None

    def _listing(self, rel: str, reader: Reader) -> Listing:
        path = os.path.join(self.common, rel)
        try:
            st = os.lstat(path)
        except OSError:
            return Listing([], {}, [], {})  # gone, or never there: its parent's listing says so
        if not stat.S_ISDIR(st.st_mode):
            return Listing([], {}, [], {})
        ident = _identity(st)
        known = self._known().get(rel)
        if known and known[0] == ident and _touch(known[2]):
            self.dirs[rel] = f"{ident} {known[2]}"
            return Listing(list(known[1]), {}, [], {})
        started = time.time_ns()
        found = reader(rel, path, load(known[2], logs=rel.startswith("logs/")) if known else None)
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
        return Listing(found.subdirs, {}, [], {})

    def _known(self) -> dict[str, list[Any]]:
        if self._index is None:
            self._index = _load_index(self._index_path)
        return self._index

    def save(self) -> None:
        """Add the directories listed anew to the repository's index of listings (a
        concurrent run's additions may be lost: then a later snapshot reads those again).
        A listing the index no longer names goes once no snapshot used it for a week:
        a run that began with one and is still going, or an audit, needs it."""
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
                if stem not in kept and os.lstat(path).st_mtime < time.time() - _UNUSED_FOR:
                    os.unlink(path)
            except OSError:
                pass
        _sweep()


def _sweep() -> None:
    """What no snapshot used for a week goes, whichever repository it was of (one that is
    gone leaves its files behind otherwise); an index goes once none of its listings is left."""
    cutoff = time.time() - _UNUSED_FOR
    indexes = []
    try:
        with os.scandir(store_dir()) as it:
            for dent in it:
                stem = dent.name[:-len(".json")]
                if _STEM.fullmatch(stem) and dent.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(dent.path)
                elif re.fullmatch(r"[0-9a-f]{16}", stem):
                    indexes.append(Path(dent.path))
        for path in indexes:
            if not any((store_dir() / f"{entry[2]}.json").exists() for entry in _load_index(path).values()):
                os.unlink(path)
    except OSError:
        pass  # a sweep is housekeeping: never in the way of the snapshot


def changed_listings(before: dict[str, str], after: dict[str, str]
                     ) -> tuple[dict[str, Listing | None], dict[str, Listing | None]]:
    """The listings, before and after, of the directories whose record changed between two
    snapshots' `dirs` (None: the listing is gone from the store, or not what was stored)."""
    changed = {rel for rel in {*before, *after} if before.get(rel) != after.get(rel)}
    return ({rel: load(before[rel], logs=rel.startswith("logs/")) for rel in changed if rel in before},
            {rel: load(after[rel], logs=rel.startswith("logs/")) for rel in changed if rel in after})


def unchanged_listings(before: dict[str, str], after: dict[str, str], refs: set[str]) -> dict[str, Listing | None]:
    """The listings of directories kept by identity in both snapshots alike that hold one
    of `refs`: a ref whose packed value changed while a loose file overrides it there, as
    git reads it, did not change."""
    rels = {ref.rsplit("/", 1)[0] for ref in refs}
    return {rel: load(before[rel], logs=False) for rel in rels if rel in before and before[rel] == after.get(rel)}


def load(record: str, *, logs: bool) -> Listing | None:
    """The listing a `dirs` record (or an index entry) names, where its bytes still have
    that digest and hold what a listing of refs (`logs`: of reflogs) holds."""
    stem = record.rsplit(" ", 1)[-1]
    if not _STEM.fullmatch(stem):
        return None
    try:
        data = (store_dir() / f"{stem}.json").read_bytes()
    except OSError:
        return None
    if sha256_hex(data) != stem.rsplit("-", 1)[-1]:
        return None
    try:
        raw = json.loads(data)
        listing = Listing(raw["subdirs"], raw["entries"], raw["locks"], raw["idents"], float(raw["taken_at"]))
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(listing.subdirs, list) and isinstance(listing.locks, list)
            and isinstance(listing.entries, dict) and isinstance(listing.idents, dict)):
        return None
    entry_ok = _is_entry if logs else (lambda value: isinstance(value, str))
    if not (all(isinstance(x, str) for x in [*listing.subdirs, *listing.locks, *listing.idents.values()])
            and all(map(entry_ok, listing.entries.values()))):
        return None
    return listing


def _is_entry(value: Any) -> bool:
    return (isinstance(value, list) and len(value) == 3 and isinstance(value[0], str) and isinstance(value[1], int)
            and isinstance(value[2], str))


def _put(repo: str, found: Listing) -> str:
    """Store a listing (named by its repository and digest); its file's name."""
    data = json.dumps(found._asdict(), sort_keys=True).encode()
    stem = f"{repo}-{sha256_hex(data)}"
    if not _touch(stem):
        _write_atomic(store_dir() / f"{stem}.json", data)
    return stem


def _touch(stem: str) -> bool:
    """Mark a stored listing as in use (pruning goes by that); False where it is not there."""
    try:
        os.utime(store_dir() / f"{stem}.json")
        return True
    except OSError:
        return False


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
            if isinstance(v, list) and len(v) == 3 and isinstance(v[0], str) and isinstance(v[1], list)
            and all(isinstance(name, str) and name and "/" not in name and name not in (".", "..") for name in v[1])
            and isinstance(v[2], str) and _STEM.fullmatch(v[2])}


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_file(path, data)
