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
import itertools
import os
import re
import stat
import time
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, NamedTuple

from ccm_guard import git
from ccm_guard.detect import objects, refdirs
from ccm_guard.digest import sha256_hex
from ccm_guard.files import identity
from ccm_guard.state.pins import BRANCH_PREFIX, Pins

HASH_LIMIT = 1 << 20  # larger files are tracked by identity, not content
# Config files are kept whole up to this size, so that a padded file cannot push a
# code-running key out of the key-by-key report.
CONFIG_LIMIT = 1 << 24
# An index is hashed even when large: its content, not its timestamp, tells whether a git
# command ran in that worktree (`touch index` must not pass for one).
INDEX_HASH_LIMIT = 1 << 26
CONTENT_LIMIT = 1 << 16  # config-like files whose bytes we keep to report key by key
PATH_LIMIT = 3072  # directories with longer paths are not listed (PATH_MAX is 4096 here)

# Where the common dir's own walk does not go: objects are inventoried separately,
# refs are parsed, and lock/temporary files are transient by nature.
_SKIP_TOP = {"objects", "refs", "packed-refs"}


class Entry(NamedTuple):
    kind: str  # "f" file, "d" directory, "l" symlink, "o" anything else
    mode: int
    digest: str  # sha256 of a file's bytes, a symlink's target, or "id:<ino>:<size>:<mtime>:<ctime>"


@dataclasses.dataclass
class Snapshot:
    """The git metadata a run could touch, read from the files at one moment."""

    files: dict[str, Entry]  # "common/<rel>" and "pointer" (the worktree's .git file)
    contents: dict[str, bytes]  # the bytes of config files, for key-by-key reports
    refs: dict[str, str]  # refname -> "<sha>" or "ref: <target>" or "symlink: <target>"
    objects: dict[str, tuple[int, int, int, int]]  # rel path under objects/ -> identity
    taken_at: float
    # Lock files outside the task's own admin dir ("common/<rel>"): another git at work, or
    # one left behind for the person's next command to trip on (judged by who holds it).
    locks: tuple[str, ...] = ()
    # Loose refs ("refs/...") and shared reflogs ("common/logs/refs/...") -> their file's
    # identity: the next snapshot reads again only those whose file changed (20k branches
    # with their reflogs cost a second and a half to read twice).
    ref_ids: dict[str, str] = dataclasses.field(default_factory=dict)
    # A sandboxed run's: the ref directories the agent can write (read in full, as every
    # one is where this is None), and the others kept by identity, rel -> "<identity>
    # <listing>", their entries left out of `refs` and `files` (detect/refdirs.py).
    open_refs: tuple[str, ...] | None = None
    dirs: dict[str, str] = dataclasses.field(default_factory=dict)
    # 2: locks and every task's guard hooks are recorded. A baseline written by an older
    # ccm-guard (1) has neither, so what they would show is not judged against it.
    format: int = 2

    def to_json(self) -> dict[str, Any]:
        return {
            "files": {k: [e.kind, e.mode, e.digest] for k, e in self.files.items()},
            "contents": {k: v.decode("utf-8", "surrogateescape") for k, v in self.contents.items()},
            "refs": self.refs,
            "objects": {k: list(v) for k, v in self.objects.items()},
            "taken_at": self.taken_at,
            "locks": list(self.locks),
            "ref_ids": self.ref_ids,
            "open_refs": None if self.open_refs is None else list(self.open_refs),
            "dirs": self.dirs,
            "format": self.format,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Snapshot":
        return cls(
            files={k: Entry(v[0], v[1], v[2]) for k, v in data["files"].items()},
            contents={k: v.encode("utf-8", "surrogateescape") for k, v in data["contents"].items()},
            refs=dict(data["refs"]),
            objects={k: (v[0], v[1], v[2], v[3]) for k, v in data["objects"].items()},
            taken_at=data["taken_at"],
            locks=tuple(data.get("locks", ())),
            ref_ids=dict(data.get("ref_ids", {})),
            open_refs=None if data.get("open_refs") is None else tuple(data["open_refs"]),
            dirs=dict(data.get("dirs", {})),
            format=data.get("format", 1),
        )


def take(pins: Pins, previous: Snapshot | None = None, *, sandboxed: bool = False) -> Snapshot:
    """Capture the common dir's files, the worktree's `.git` pointer, the host files that
    steer git or ccm-guard (with the files the config files include: they are few and read
    first, so the walk is not done twice), the refs and the object inventory. Pure file
    reads; no git. A loose ref whose file is as in `previous` keeps its value from there.
    `sandboxed` (or a sandboxed `previous`): the ref directories closed to the agent are
    kept by identity where they can be (detect/refdirs.py)."""
    from ccm_guard.git.config import include_targets

    common = pins.common_dir
    open_refs = previous.open_refs if previous is not None else _open_refs(pins) if sandboxed else None
    closed = refdirs.Closed(common, open_refs) if open_refs is not None else None
    extra_files: list[Path] = []
    for path in (common / "config", common / "config.worktree", *common.glob("worktrees/*/config.worktree")):
        data = read_nofollow(path)
        if data:
            extra_files += include_targets(path, data)
    files: dict[str, Entry] = {}
    contents: dict[str, bytes] = {}
    own = f"worktrees/{pins.admin_name}/"
    locks: list[str] = []
    ref_ids: dict[str, str] = {}
    reuse = _Reuse(ref_ids, previous)

    def add(rel: str, entry: Entry, data: bytes | None) -> None:
        key = f"common/{rel}"
        if rel.endswith(".lock") and not rel.startswith(own):
            locks.append(key)  # another git at work right now, or one left behind: see `locks`
            return
        files[key] = entry
        if data is not None and _is_config(rel):
            contents[key] = data
        elif entry.kind == "f" and _is_config(rel):
            config = _read_config(common / rel)  # larger than CONTENT_LIMIT
            if config is not None:
                contents[key] = config

    for rel, entry, data in _walk(common, skip_top=_SKIP_TOP, reuse=reuse, skip=() if closed is None else ("logs/refs",)):
        add(rel, entry, data)
    for rel, found in closed.walk("logs/refs", _reflog_listing) if closed is not None else ():
        if found is None:  # open to the agent: read in full
            for sub, entry, data in _walk(common / rel, reuse=reuse, base=f"{rel}/"):
                add(sub, entry, data)
        else:
            _put_back(rel, found, {}, files)
            locks += found.locks
    for name in ("objects/info",):
        for rel, entry, data in _walk(common / name):
            if rel.endswith(".lock"):  # commit-graph.lock: as the others (a gc at work, or left behind)
                locks.append(f"common/{name}/{rel}")
                continue
            files[f"common/{name}/{rel}"] = entry
    pointer = _read_entry(pins.worktree / ".git")
    if pointer is not None:
        files["pointer"] = pointer[0]
        if pointer[1] is not None:
            contents["pointer"] = pointer[1]
    _host_files(pins, files, contents, tuple(extra_files))
    refs = read_refs(common, locks, reuse=reuse, closed=closed)
    if closed is not None:
        closed.save()
    return Snapshot(files, contents, refs, objects.inventory(common / "objects"), time.time(), tuple(locks),
                    ref_ids=ref_ids, open_refs=open_refs, dirs=closed.dirs if closed is not None else {})


def _open_refs(pins: Pins) -> tuple[str, ...]:
    """The ref directories a sandboxed agent can write (prevent/roots.py): its branch's
    and every task's (refs/heads/ccm/, whose siblings are judged by their reflogs), with
    their reflogs' directories."""
    dirs = dict.fromkeys((pins.branch_ref.rsplit("/", 1)[0], "refs/heads/" + BRANCH_PREFIX.rstrip("/")))
    return (*dirs, *(f"logs/{d}" for d in dirs))


def with_listings(snap: Snapshot, listings: dict[str, refdirs.Listing | None]) -> Snapshot:
    """`snap` with the entries of directories it kept by identity put back, from their
    listings (one that is gone from the store shows as a change of its own)."""
    if not listings:
        return snap
    refs, files = dict(snap.refs), dict(snap.files)
    for rel, listing in listings.items():
        if listing is None:  # the record in it: two different lost listings do not compare equal
            files[f"common/{rel}/"] = Entry("o", 0, f"unknown: listing {snap.dirs.get(rel)} is gone from the state home")
        else:
            _put_back(rel, listing, refs, files)
    return dataclasses.replace(snap, refs=refs, files=files)


def reflogs_by_presence(snap: Snapshot, rels: Collection[str]) -> Snapshot:
    """`snap` with the reflogs directly in the directories `rels` recorded without their
    contents (kind and mode only)."""
    if not rels:
        return snap
    parents = {f"common/{rel}" for rel in rels}
    files = {key: entry._replace(digest="") if entry.kind == "f" and key.rsplit("/", 1)[0] in parents else entry
             for key, entry in snap.files.items()}
    return dataclasses.replace(snap, files=files)


def _put_back(rel: str, listing: refdirs.Listing, refs: dict[str, str], files: dict[str, Entry]) -> None:
    """A closed directory's entries, from its listing, into a snapshot's `refs` (a directory
    of refs) or `files` (one of reflogs)."""
    if rel.startswith("logs/"):
        files.update((key, Entry(*value)) for key, value in listing.entries.items())
    else:
        refs.update(listing.entries)


# --- files outside the repository that steer git or ccm-guard --------------------------------


def _host_files(pins: Pins, files: dict[str, Entry], contents: dict[str, bytes],
                include_targets: tuple[Path, ...]) -> None:
    """What git and ccm-guard read from outside the repository, for the person's next command:

    - `include/<path>`: files the repository's config includes, and what they include in
      turn (ccm-guard's own git reads these too);
    - `hostconfig/<path>`: the global git config (`~/.gitconfig`, `$XDG_CONFIG_HOME/git/config`)
      and what it includes: an unsandboxed agent can plant a hook path or a pager there that
      the person's git runs in every repository;
    - `host/<path>`: every file in the hooks directories those configs name (the task's own,
      under the state home, which its kept worktree runs; a person's `core.hooksPath`), and
      ccm-guard's own user policy, which the next `exec` reads.
    """
    common = pins.common_dir
    configs: list[tuple[Path, bytes]] = []
    for rel in ("config", "config.worktree", f"worktrees/{pins.admin_name}/config.worktree"):
        data = contents.get(f"common/{rel}")
        if data is not None:
            configs.append((common / rel, data))
    queue = [("include", path) for path in include_targets] + [("hostconfig", path) for path in git.global_config_files()]
    seen: set[Path] = set()
    while queue:
        prefix, path = queue.pop(0)
        if path in seen or len(seen) > 64:  # include cycles; a bound on what an agent can make us read
            continue
        seen.add(path)
        data = _record(files, contents, f"{prefix}/{path}", path, keep=True)
        if data is not None:
            configs.append((path, data))
            queue += [(prefix, target) for target in _includes(path, data)]
    from ccm_guard.state.home import home, hooks_dir

    # ccm-guard's own guard hooks for every task of the repository (a finished task's
    # worktree runs its hooks on the person's next commit there), then the hooks dirs the
    # configs name (the person's core.hooksPath, which may lie anywhere).
    guard_hooks = hooks_dir(common)
    _record(files, contents, f"host/{guard_hooks}", guard_hooks, keep=False)
    for rel, entry, _ in itertools.islice(_walk(guard_hooks), 65536):  # a few files per task
        files[f"host/{guard_hooks}/{rel}"] = entry
    for config, data in configs:
        for hooks in _hooks_dirs(config, data, common):
            _record(files, contents, f"host/{hooks}", hooks, keep=False)
            # Bounded: a hooks path of "/" must not make every snapshot walk the disk.
            for rel, entry, _ in itertools.islice(_walk(hooks), 4096):
                files[f"host/{hooks}/{rel}"] = entry

    _record(files, contents, f"host/{home() / 'policy.toml'}", home() / "policy.toml", keep=False)


def _record(files: dict[str, Entry], contents: dict[str, bytes], key: str, path: Path, keep: bool) -> bytes | None:
    """Record `path` (and, for a symlink such as a dotfile manager's, the file it leads to)."""
    found = _read_entry(path)
    files[key] = found[0] if found else Entry("-", 0, "")
    if found is None:
        return None
    entry, data = found
    if entry.kind == "l":
        target = Path(os.path.realpath(path))
        followed = _read_entry(target)
        files[key + " -> " + str(target)] = followed[0] if followed else Entry("-", 0, "")
        if followed is None or followed[0].kind != "f":
            return None
        data = followed[1] if followed[1] is not None else (_read_config(target) if keep else None)
        path = target
    elif entry.kind == "f" and data is None and keep:
        data = _read_config(path)
    if keep and data is not None:
        contents[key] = data
    return data


def _read_config(path: Path) -> bytes | None:
    try:
        if os.lstat(path).st_size > CONFIG_LIMIT:
            return None
        with open(path, "rb") as fh:
            return fh.read(CONFIG_LIMIT + 1)[:CONFIG_LIMIT]
    except OSError:
        return None


def _includes(path: Path, data: bytes) -> list[Path]:
    from ccm_guard.git.config import include_targets

    try:
        return include_targets(path, data)
    except Exception:  # an unparseable file: the config diff reports it as such
        return []


def _hooks_dirs(config: Path, data: bytes, common: Path) -> list[Path]:
    """The directories `core.hooksPath` names in one config file, as absolute paths."""
    from ccm_guard.git.config import hooks_paths

    try:
        values = hooks_paths(data)
    except Exception:
        return []
    # Relative: from the top of the checkout git runs in; the main one is the common dir's parent.
    return [Path(v) if os.path.isabs(v) else common.parent / v for v in values]


def _is_config(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return name.startswith("config") or name in ("HEAD", "commondir", "gitdir")


def _walk(root: Path, skip_top: Collection[str] = (), *, identity_of: bool = False,
          reuse: _Reuse | None = None, base: str = "", skip: Collection[str] = ()
          ) -> Iterator[tuple[str, Entry, bytes | None]]:
    """Every entry below `root`, without following symlinks, as (`base` + relative path,
    entry, bytes); `identity_of`: every file by its identity, none read; `reuse`: a shared
    reflog whose file did not change keeps the entry of the earlier snapshot; `skip`: the
    directories not to go into."""
    stack: list[tuple[str, str | Path]] = [(base, root)]
    while stack:
        prefix, directory = stack.pop()
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        with it:
            for dent in it:
                rel = prefix + dent.name
                if prefix == base and dent.name in skip_top:
                    continue
                # Object stores (submodules', git-lfs') are tracked by identity: hashing
                # gigabytes twice per run would dwarf the run itself. Paths stay strings
                # here: a Path per entry was most of a 40k-file walk.
                if reuse is not None and rel.startswith("logs/refs/"):
                    found = reuse.reflog(rel, dent.path)
                else:
                    found = _read_entry(dent.path, by_identity=identity_of or "objects/" in rel or rel.startswith("lfs/"))
                if found is None:
                    continue
                entry, data = found
                if entry.kind == "d" and len(dent.path) > PATH_LIMIT:
                    # Deeper than the system can name (an agent's mkdir loop): recorded as such
                    # (a new one is reported), not listed, and no crash in the middle of a verdict.
                    yield rel, Entry("d", entry.mode, "too deep to list"), None
                    continue
                yield rel, entry, data
                if entry.kind == "d" and rel not in skip:
                    stack.append((rel + "/", dent.path))


def _read_entry(path: Path | str, by_identity: bool = False) -> tuple[Entry, bytes | None] | None:
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # too long a name, a loop of mounts: say so rather than fail the verdict
        return Entry("o", 0, f"unreadable: {exc.strerror}"), None
    return _entry_of(path, st, by_identity)


def _entry_of(path: Path | str, st: os.stat_result, by_identity: bool) -> tuple[Entry, bytes | None] | None:
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISDIR(st.st_mode):
        return Entry("d", mode, ""), None
    if stat.S_ISLNK(st.st_mode):
        return Entry("l", mode, os.readlink(path)), None
    if not stat.S_ISREG(st.st_mode):
        return Entry("o", mode, f"type:{stat.S_IFMT(st.st_mode)}"), None
    if by_identity or st.st_size > (INDEX_HASH_LIMIT if _is_index(path) else HASH_LIMIT):
        return Entry("f", mode, identity(st)), None
    data = read_nofollow(path)
    if data is None:
        return None
    return Entry("f", mode, sha256_hex(data)), data if len(data) <= CONTENT_LIMIT else None


def _is_index(path: Path | str) -> bool:
    """An index, or the shared half of a split one: hashed however large (git touches a
    shared index each time it reads it, which is no change)."""
    name = os.path.basename(path)
    return name == "index" or name.startswith("sharedindex.")


def with_file_as_now(snap: Snapshot, common: Path, rel: str) -> Snapshot:
    """`snap` with one file of the common dir as it is now: for a baseline that a later
    step of ccm-guard's own made stale (a restored task's worktree is made anew)."""
    key = f"common/{rel}"
    files, contents = dict(snap.files), dict(snap.contents)
    files.pop(key, None)
    contents.pop(key, None)
    found = _read_entry(common / rel)
    if found is not None:
        files[key] = found[0]
        if found[1] is not None and _is_config(rel):
            contents[key] = found[1]
    return dataclasses.replace(snap, files=files, contents=contents)


def without(snap: Snapshot, prefix: str) -> Snapshot:
    """`snap` without the files under `prefix` (a key prefix such as "host/<dir>")."""
    return dataclasses.replace(snap, files={k: v for k, v in snap.files.items() if not k.startswith(prefix)},
                               contents={k: v for k, v in snap.contents.items() if not k.startswith(prefix)})


def read_nofollow(path: Path | str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError:
        return b""
    try:  # plain os calls: a file object per file was a third of reading 40k refs and reflogs
        # A file's size in one read: one too large for memory fails at once, not after
        # filling it chunk by chunk.
        data = os.read(fd, os.fstat(fd).st_size + 1)
        if not data:
            return data
        chunks = [data]
        while chunk := os.read(fd, 1 << 16):  # it grew meanwhile: read to the end, as before
            chunks.append(chunk)
        return data if len(chunks) == 1 else b"".join(chunks)
    except OSError:
        return b""
    finally:
        os.close(fd)


# A packed-refs record and a peeled line, as git writes them.
# A packed-refs record (with the peeled line that may follow it) and a peeled line, as git
# writes them. A record's peeled value is kept as "<ref>^{}": git serves it (describe,
# show-ref -d, what a fetch from here advertises) without reading the tag.
_PACKED_RECORD = re.compile(r"^([0-9a-f]{40}(?:[0-9a-f]{24})?) (refs/[^\n]*)(?:\n\^([0-9a-f]{40}(?:[0-9a-f]{24})?))?$",
                            re.M)
_PACKED_PEELED = re.compile(r"^\^[0-9a-f]{40}(?:[0-9a-f]{24})?$", re.M)
PEELED = "^{}"


def _packed_refs(data: bytes) -> dict[str, str]:
    """The records of `packed-refs`: a file as git writes it in a few C-speed passes (20k
    tags cost ~20 ms a snapshot line by line), anything else by the strict reading."""
    text = data.decode("utf-8", "surrogateescape")  # byte order is kept: surrogates stand for the bytes
    body = text[text.find("\n") + 1:] if text.startswith("# pack-refs with:") and "\n" in text else text
    if body.startswith(("^", "# pack-refs with:")):
        return _packed_refs_strictly(data)
    records = _PACKED_RECORD.findall(body)
    lines = body.count("\n") + (1 if body and not body.endswith("\n") else 0)
    peels = sum(1 for _, _, peel in records if peel)
    if len(records) + peels != lines or peels != len(_PACKED_PEELED.findall(body)):
        return _packed_refs_strictly(data)  # a line that is neither, or a stray peeled one: reported as such
    # In git's order, bytes (past ASCII, text order is not byte order for every escape).
    names = [name if body.isascii() else name.encode("utf-8", "surrogateescape") for _, name, _ in records]
    if any(later <= earlier for earlier, later in zip(names, names[1:])):
        return _packed_refs_strictly(data)  # out of order or twice: reported as such
    refs = {}
    for sha, name, peel in records:  # in the file's order, as the strict reading sets them
        refs[name] = sha
        if peel:
            refs[name + PEELED] = peel
    return refs


def _packed_refs_strictly(data: bytes) -> dict[str, str]:
    """The records of `packed-refs`, read strictly. Git writes it sorted, one record per
    ref, and reads it by binary search: a duplicated or out-of-order record makes git see
    one value where a plain parse sees another, so such a file is reported as a value
    of its own ("packed-refs" -> "malformed: ..."), which any run that causes it fails on."""
    refs: dict[str, str] = {}
    problems: list[str] = []
    last: bytes | None = None
    peelable: str | None = None  # the record on the line above: a peeled line may follow only that (git dies otherwise)
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # the file's final newline
    for number, line in enumerate(lines, start=1):
        if line.startswith(b"# pack-refs with:") and number == 1:
            continue
        if line.startswith(b"^") and peelable is not None and git.is_oid(line[1:]):
            refs[peelable + PEELED] = line[1:].decode()  # the peeled value of the record above
            peelable = None
            continue
        peelable = None
        sha, space, raw_name = line.partition(b" ")
        name = raw_name.decode("utf-8", "surrogateescape")
        if not space or not git.is_oid(sha) or not raw_name.startswith(b"refs/"):
            problems.append(f"line {number} is not a ref record")
            continue
        if name in refs:
            problems.append(f"two records for {name}")
        elif last is not None and raw_name < last:
            problems.append(f"{name} is out of order")
        refs[name] = sha.decode()
        last = raw_name
        peelable = name
    if problems:
        refs["packed-refs"] = "malformed: " + "; ".join(problems[:3])
    return refs


class _Reuse:
    """What a snapshot may keep from the one before it: a loose ref's value or a reflog's
    entry whose file has the same identity. A write always changes a file's change time,
    which no one can set back; a file last changed in the two seconds before the earlier
    snapshot is read again all the same, as git treats a "racily clean" index entry (on a
    file system with coarse timestamps a rewrite could keep the same one)."""

    def __init__(self, ids: dict[str, str], previous: Snapshot | None) -> None:
        self.ids = ids  # filled in for the next snapshot
        self.previous = previous
        self.settled_ns = int((previous.taken_at - 2) * 1e9) if previous is not None else 0

    def unchanged(self, key: str, ident: str) -> Snapshot | None:
        """Record a file's identity; the earlier snapshot, if the file is as it saw it."""
        self.ids[key] = ident
        before = self.previous
        settled = int(ident.rsplit(":", 1)[1]) < self.settled_ns  # its change time
        return before if before is not None and settled and before.ref_ids.get(key) == ident else None

    def reflog(self, rel: str, path: str) -> tuple[Entry, bytes | None] | None:
        key = f"common/{rel}"
        try:
            st = os.lstat(path)
        except OSError:
            return _read_entry(path)
        before = self.unchanged(key, identity(st)) if stat.S_ISREG(st.st_mode) else None
        if before is not None and key in before.files:
            return before.files[key], None
        return _entry_of(path, st, by_identity=False)


def read_refs(common: Path, locks: list[str] | None = None, *, reuse: _Reuse | None = None,
              closed: refdirs.Closed | None = None) -> dict[str, str]:
    """All refs of the common dir: packed first, loose ones override (as git reads them).
    Lock files found among them are added to `locks` ("common/refs/<rel>"). With `reuse`,
    a loose ref whose file did not change since the earlier snapshot keeps its value.
    With `closed`, the directories closed to the agent are kept by identity where they can be."""
    refs = _packed(common / "packed-refs", reuse)
    found_locks: list[str] = []
    for top, found in closed.walk("refs", _ref_listing) if closed is not None else [("refs", None)]:
        if found is not None:
            _put_back(top, found, refs, {})
            found_locks += found.locks
            continue
        for rel, entry, data in _walk(common / top, identity_of=reuse is not None, base=f"{top}/"):
            if rel.endswith(".lock"):  # a ref update in flight (or left behind), not a ref: git reads it so
                found_locks.append(f"common/{rel}")
                continue
            if "/." in rel:
                continue  # git reads no ref whose name has a part that begins with a dot (ccm-guard's keep file)
            if entry.kind == "f" and reuse is not None:  # the walk gave the file's identity, not its bytes
                before = reuse.unchanged(rel, entry.digest)
                if before is not None and rel in before.refs:
                    refs[rel] = before.refs[rel]
                    continue
                data = read_nofollow(common / rel)
            value = _ref_value(entry, data)
            if value is not None:
                refs[rel] = value
    if locks is not None:
        locks += found_locks
    return refs


_PACKED_SEEN: dict[str, tuple[str, dict[str, str]]] = {}  # path -> (identity, records) this process read


def _packed(path: Path, reuse: _Reuse | None) -> dict[str, str]:
    """packed-refs' records; with `reuse`, those this process read the last time where the
    file is as the earlier snapshot saw it (20k tags are parsed once per run, not twice)."""
    try:
        ident = identity(os.lstat(path))
    except OSError:
        ident = None
    seen = _PACKED_SEEN.get(str(path))
    if reuse is not None and ident is not None and seen is not None and seen[0] == ident \
            and reuse.unchanged("packed-refs", ident) is not None:
        return dict(seen[1])
    refs = _packed_refs(read_nofollow(path) or b"")
    if reuse is not None and ident is not None:
        reuse.unchanged("packed-refs", ident)  # recorded for the next snapshot
        _PACKED_SEEN[str(path)] = (ident, dict(refs))
    return refs


def _ref_value(entry: Entry, data: bytes | None) -> str | None:
    """What a loose ref's file says, as a snapshot records it (None: a directory)."""
    if entry.kind == "l":
        return f"symlink: {entry.digest}"
    if entry.kind == "f":
        text = (data or b"").decode("utf-8", "surrogateescape").strip()
        return text if text.startswith("ref: ") else text[:64]
    return None if entry.kind == "d" else f"other: {entry.digest}"


def _ref_listing(rel: str, path: str, previous: refdirs.Listing | None) -> refdirs.Listing:
    """A closed directory of refs read from its files: its refs' values (one whose file is
    as `previous` saw it keeps its value from there), locks and subdirectories."""
    return _listing(rel, path, previous, key=lambda name: f"{rel}/{name}", value=_ref_of_file)


def _reflog_listing(rel: str, path: str, previous: refdirs.Listing | None) -> refdirs.Listing:
    """A closed directory of reflogs read from its files, each by its content and mode as
    everywhere else (`git reflog expire` rewrites them all as new files with the same
    lines), locks and subdirectories."""
    return _listing(rel, path, previous, key=lambda name: f"common/{rel}/{name}",
                    value=lambda path, st: (_entry_of(path, st, by_identity=False) or (None,))[0])


def _listing(rel: str, path: str, previous: refdirs.Listing | None, *, key: Callable[[str], str],
             value: Callable[[str, os.stat_result], Any]) -> refdirs.Listing:
    listing = refdirs.Listing([], {}, [], {}, time.time())
    for name, dent_path, is_dir in _entries(path):
        if name.endswith(".lock"):
            listing.locks.append(f"common/{rel}/{name}")
            continue
        if name.startswith(".") and rel.startswith("refs"):
            continue  # no ref to git (ccm-guard's keep file)
        if is_dir:
            listing.subdirs.append(name)
        try:
            st = os.lstat(dent_path)
        except OSError:
            continue
        ident = identity(st)
        found = previous.reusable(key(name), ident) if previous is not None else None
        if found is None:
            found = value(dent_path, st)
        if found is not None:
            listing.entries[key(name)] = list(found) if isinstance(found, Entry) else found
            listing.idents[key(name)] = ident
    return listing


def _ref_of_file(path: str, st: os.stat_result) -> str | None:
    found = _entry_of(path, st, by_identity=True)  # no hash: a ref's bytes are read below
    if found is None:
        return None
    entry = found[0]
    return _ref_value(entry, read_nofollow(path) if entry.kind == "f" else None)


def _entries(path: str) -> Iterator[tuple[str, str, bool]]:
    """A directory's entries: (name, path, is a directory to go into), without following links."""
    try:
        with os.scandir(path) as it:
            for dent in it:
                is_dir = dent.is_dir(follow_symlinks=False) and len(dent.path) <= PATH_LIMIT
                yield dent.name, dent.path, is_dir
    except OSError:
        return


def file_identity(work_tree: Path, entry: git.StatusEntry) -> str:
    """A dirty or untracked file as status shows it, with its size and times: any write
    changes the change time, which no one can set back."""
    try:
        st = os.lstat(work_tree / entry.path)
    except OSError:
        return f"{entry.code}:missing"
    return f"{entry.code}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def main_files(main: git.Repo) -> dict[str, str]:
    """The person's dirty and untracked files with an identity each (changes show as a new one)."""
    return {entry.path: file_identity(Path(main.work_tree or "/"), entry) for entry in git.status(main)}
