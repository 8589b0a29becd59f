"""The warm pool's tables and entries: the rows, claiming one, what "pristine" means, and
destroying one. The design and the states an entry goes through: `pool/__init__.py`.

Pristine, when taken: its index file exactly as ccm-guard wrote it (inode, size, mtime
and ctime: any write changes the ctime, which no unprivileged process can set back), no
`.git` in the directory, and `git status --ignored` against that index reports nothing
on the work tree side: no untracked or ignored leftovers, every file as the index says.

That status walks the whole tree and matches every name against the ignore rules (about
20 ms at 10k files, far more at 100k), so it runs when an entry is made or comes back,
off the critical path; a take then needs only proof that nothing changed since. The proof
(`<id>.dirs`, its identity in the row like the index's): every directory's inode, mtime
and ctime, recorded just before that status, and only once each was last changed a
second or more before (file systems whose times tick by the second). A name made, removed or renamed anywhere
in the tree changes its directory's mtime and ctime, and a chmod its ctime; no
unprivileged process can set a ctime back. So a take checks each directory's identity
(no new name anywhere: no leftover) and has `git diff-files` compare each tracked file
with the index (no file changed). Anything else, and the take walks the tree as before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any

from ccm_guard import git
from ccm_guard.errors import RepoError
from ccm_guard.files import read_regular
from ccm_guard.state import trash
from ccm_guard.state.registry import Registry, pid_alive

LIVE_STATES = ("filling", "taking", "returning")  # a process is at work on the entry

SCHEMA = """
CREATE TABLE IF NOT EXISTS pool (
    id TEXT PRIMARY KEY,           -- p-<hex>: its directory under pool/<repo-key>/
    repo TEXT NOT NULL,            -- the common dir (real path)
    home TEXT NOT NULL,            -- its directory while pooled; the index is home + ".index"
    path TEXT NOT NULL,            -- where its files are now (or are being renamed to)
    base TEXT NOT NULL DEFAULT '', -- the commit its files and index are at while pooled
    state TEXT NOT NULL,           -- filling, ready, taking, out, returning
    task TEXT,                     -- the task that has it
    pid INTEGER,                   -- the process filling, taking or returning it
    fingerprint TEXT NOT NULL DEFAULT '',  -- the index file's identity, as ccm-guard left it
    updated_at REAL NOT NULL,
    proof TEXT NOT NULL DEFAULT ''  -- the identity of <id>.dirs, recorded with the last full check
);
CREATE INDEX IF NOT EXISTS pool_repo ON pool(repo, state);
CREATE TABLE IF NOT EXISTS pool_repos (
    repo TEXT PRIMARY KEY,         -- the common dir
    size INTEGER NOT NULL,         -- how many ready entries to keep
    rev TEXT NOT NULL,             -- "a recent base": resolved when an entry is made or comes back
    key TEXT NOT NULL,             -- the repository's directory name under pool/
    main_git_dir TEXT NOT NULL,    -- where `rev` is resolved (HEAD is the person's checkout's)
    main_worktree TEXT NOT NULL,
    refill INTEGER NOT NULL DEFAULT 1  -- make a new entry in the background when one is taken
);
"""


@dataclasses.dataclass
class Entry:
    """One warm worktree of the pool, as the registry records it."""

    id: str
    repo: str
    home: str
    path: str
    base: str
    state: str
    task: str | None
    pid: int | None
    fingerprint: str
    updated_at: float
    proof: str = ""

    @property
    def index(self) -> Path:
        return Path(self.home + ".index")

    @property
    def dirs(self) -> Path:
        """Its directories' identities, recorded with the last full check (see above)."""
        return Path(self.home + ".dirs")

    @property
    def interrupted(self) -> bool:
        """Left half-done by a process that is gone: dirty, never handed out, only destroyed."""
        return self.state in LIVE_STATES and not (self.pid is not None and pid_alive(self.pid))

    def pool_repo(self) -> git.Repo:
        """The pooled files as git sees them: the common dir's work tree, with our index."""
        return git.Repo(Path(self.repo), Path(self.repo), Path(self.path))


@dataclasses.dataclass
class RepoConfig:
    """A repository's pool settings, as the registry records them."""

    repo: str
    size: int
    rev: str
    key: str
    main_git_dir: str
    main_worktree: str
    refill: int = 1

# --- the tables ------------------------------------------------------------------------------


def open_registry(registry: Registry | None = None) -> Registry:
    registry = registry or Registry()
    registry.db.executescript(SCHEMA)
    for table, column, kind in (("pool_repos", "refill", "INTEGER NOT NULL DEFAULT 1"),
                                ("pool", "proof", "TEXT NOT NULL DEFAULT ''")):
        if column in {row[1] for row in registry.db.execute(f"PRAGMA table_info({table})")}:
            continue
        try:  # tables made by an older ccm-guard
            registry.db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
        except sqlite3.OperationalError as exc:
            if "duplicate column" not in str(exc):
                raise  # another process added it first: fine
    return registry


def config_of(registry: Registry, repo: Path) -> RepoConfig | None:
    row = registry.db.execute("SELECT * FROM pool_repos WHERE repo = ?", (str(repo),)).fetchone()
    return config_from(row) if row else None


def config_from(row: sqlite3.Row) -> RepoConfig:
    # Only the columns this version knows: a later one's additions are not our business.
    return RepoConfig(**{f.name: row[f.name] for f in dataclasses.fields(RepoConfig) if f.name in row.keys()})


def entries(registry: Registry, repo: Path | None = None, states: tuple[str, ...] = ()) -> list[Entry]:
    query, args = "SELECT * FROM pool WHERE 1 = 1", []
    if repo is not None:
        query += " AND repo = ?"
        args.append(str(repo))
    if states:
        query += f" AND state IN ({', '.join('?' * len(states))})"
        args.extend(states)
    return [Entry(**dict(r)) for r in registry.db.execute(query + " ORDER BY updated_at", args).fetchall()]


def set_fields(registry: Registry, entry: Entry, **fields: Any) -> None:
    fields["updated_at"] = time.time()
    sets = ", ".join(f"{k} = :{k}" for k in fields)
    registry.db.execute(f"UPDATE pool SET {sets} WHERE id = :id", {**fields, "id": entry.id})
    for key, value in fields.items():
        setattr(entry, key, value)


def insert(registry: Registry, entry: Entry) -> None:
    fields = dataclasses.asdict(entry)
    registry.db.execute(f"INSERT INTO pool ({', '.join(fields)}) VALUES ({', '.join(':' + k for k in fields)})",
                        fields)


def drop(registry: Registry, entry: Entry) -> None:
    registry.db.execute("DELETE FROM pool WHERE id = ?", (entry.id,))
    entry.index.unlink(missing_ok=True)
    entry.dirs.unlink(missing_ok=True)


def claim(registry: Registry, repo: Path, task: str | None, entry_id: str | None = None) -> Entry | None:
    """Mark a ready entry as ours (`taking`); None when there is none (or it was taken).

    One repository's entries change hands one process at a time (the "pool" flock: a
    killed process releases it); the registry's IMMEDIATE transaction makes each claim atomic.
    """
    from ccm_guard.state.home import admin_lock

    query = "SELECT * FROM pool WHERE repo = ? AND state = 'ready'" + (" AND id = ?" if entry_id else "")
    with admin_lock(repo, "pool"), registry.transaction():
        row = registry.db.execute(query + " ORDER BY updated_at DESC LIMIT 1",
                                  (str(repo), *((entry_id,) if entry_id else ()))).fetchone()
        if row is None:
            return None
        entry = Entry(**dict(row))
        set_fields(registry, entry, state="taking", task=task, pid=os.getpid())
    return entry


# --- what "pristine" means ---------------------------------------------------------------------


def identity(path: Path) -> str:
    st = os.lstat(path)
    return f"{stat.S_IFMT(st.st_mode)}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def problem(entry: Entry, *, trust_proof: bool = False) -> str | None:
    """Why a pooled entry may not be handed out, or None when it is pristine.

    Files first, then `git status` against ccm-guard's index (the work tree side only:
    the other half compares with the common dir's HEAD, not the entry's base).
    `trust_proof`: where the entry's proof shows nothing changed since that status last
    passed, it is not walked again (a take's critical path).
    """
    path = Path(entry.path)
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return f"{path} is not a directory"
        if identity(entry.index) != entry.fingerprint:
            return f"its index {entry.index} is not as ccm-guard left it"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror}: {exc.filename})"
    if os.path.lexists(path / ".git"):
        return f"{path / '.git'} exists: a pooled work tree has no git metadata of its own"
    if trust_proof and _unchanged_since_proof(entry):
        return None
    leftovers = [e for e in git.status_with_index(entry.pool_repo(), entry.index)
                 if e.code in ("??", "!!") or e.code[1] != "."]
    if leftovers:
        shown = ", ".join(f"{e.code} {e.path}" for e in leftovers[:3])
        return f"{len(leftovers)} leftover(s) in its work tree: {shown}"
    return None


# A file system's timestamps may be as coarse as a second (ext4 with small inodes, FAT,
# some network mounts): a name made in the same tick as a directory's last change leaves
# its times as they were. Only a directory last changed a tick before the proof was
# recorded can show every later change (git's racy-timestamp rule, for directories).
_TICK_NS = 1_050_000_000


def record_proof(registry: Registry, entry: Entry) -> None:
    """Record the identity of every directory of the entry's tree, just before the full
    check that makes it ready: a name made anywhere since shows in its directory's. The
    proof's stamp is its own file's mtime (the file system's clock, after every directory
    was read). Where a directory changed within the tick before it (a return's clean), it
    waits that out, a tick at a time (it runs in the background); a directory dated later
    than the stamp (an agent can set a directory's mtime) leaves the entry without proof."""
    root, proof = Path(entry.path), ""
    try:
        for _ in range(3):
            lines, newest = _directories(root)
            entry.dirs.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogateescape")
            stamp = os.lstat(entry.dirs).st_mtime_ns
            if newest < stamp - _TICK_NS:
                proof = identity(entry.dirs)
                break
            if newest > stamp:
                break
            time.sleep(min(newest + _TICK_NS - stamp, _TICK_NS) / 1e9 + 0.01)
    except OSError:
        pass  # no proof: the take walks the tree
    set_fields(registry, entry, proof=proof)


def _directories(root: Path) -> tuple[list[str], int]:
    """`ino mtime ctime relpath` for every directory of the tree, and the newest time seen."""
    lines, newest, todo = [], 0, [""]
    while todo:
        rel = todo.pop()
        st = os.lstat(root / rel)
        lines.append(f"{st.st_ino} {st.st_mtime_ns} {st.st_ctime_ns} {rel}")
        newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
        with os.scandir(root / rel) as listing:
            todo += [os.path.join(rel, d.name) for d in listing if d.is_dir(follow_symlinks=False)]
    return lines, newest


def _unchanged_since_proof(entry: Entry) -> bool:
    """No directory of the tree changed since its proof was recorded, and every tracked file
    is as the index says. False (walk the tree) wherever that cannot be shown."""
    root = Path(entry.path)
    try:
        if not entry.proof or identity(entry.dirs) != entry.proof:
            return False
        data = read_regular(entry.dirs, 1 << 28)
        if not data:
            return False
        stamp = int(entry.proof.split(":")[3])  # its mtime, as the identity above holds it
        for line in data.decode("utf-8", "surrogateescape").splitlines():
            ino, mtime, ctime, rel = line.split(" ", 3)
            if max(int(mtime), int(ctime)) >= stamp - _TICK_NS:
                return False  # changed in the tick the proof was taken in: it proves nothing
            st = os.lstat(root / rel)
            if (str(st.st_ino), str(st.st_mtime_ns), str(st.st_ctime_ns)) != (ino, mtime, ctime) \
                    or not stat.S_ISDIR(st.st_mode):
                return False
    except (OSError, ValueError):
        return False
    return git.files_match_index(entry.pool_repo(), entry.index)


# --- destroying ---------------------------------------------------------------------------------


def destroy(registry: Registry, entry: Entry) -> None:
    """Remove an entry wherever its files are (its home, or the task's path they were
    renamed to), with any admin dir made for it there: into the trash, deleted after this
    process. Its row and index go too."""
    from ccm_guard.git.layout import admin_dir_of
    from ccm_guard.state.home import admin_lock

    for place in dict.fromkeys((Path(entry.path), Path(entry.home))):
        if not os.path.lexists(place):
            continue
        admin = None
        with contextlib.suppress(OSError, RepoError):
            admin = admin_dir_of(place, Path(entry.repo)) if os.path.lexists(place / ".git") else None
        if admin is None:
            trash.discard(place)
        else:
            trash.remove_worktree(place, admin, lambda: admin_lock(Path(entry.repo)))
    drop(registry, entry)

