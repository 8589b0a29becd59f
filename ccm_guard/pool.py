"""The warm pool: checked-out work trees per repository, handed to tasks and taken back.

Making a work tree is the cost (PERF-NOTES: ~10 s for 100k files on ext4); re-pointing
one that exists writes only the files that differ. A pool entry is a directory under
`$CCM_GUARD_HOME/pool/<repo-key>/<id>/` checked out at a recent base, and ccm-guard's own
index file for it (`<id>.index`, its stat data taken a second after the checkout).

While pooled an entry has no git admin entry at all. Nothing of it is in the repository:
`git worktree prune` cannot touch it, and a task running meanwhile sees nothing in its
snapshots — an admin dir that is made, moved, relocked or removed under `worktrees/`
while a task runs is what the git-metadata gate reports as tampering. Handing one over
looks, to everyone else, exactly like a fresh worktree: `git worktree add --no-checkout
-b ccm/<task>` makes the admin dir (~10 ms at any size), the pooled files are renamed
into place, ccm-guard's index goes in, and a two-tree `read-tree -m -u` moves index and
files from the pool's base to the task's, touching only what differs.

    filling -> ready -> taking -> out -> returning -> ready
                 (not pristine, or any failure: destroyed, never handed out)

`filling`, `taking` and `returning` name the process at work; if it is gone the entry
is dirty and is only destroyed (`pool fill` does it). `out` is a task's: if its ccm-guard
process dies (a crash), the entry stays out, dirty, until the task is discarded.

Pristine, when taken: its index file exactly as ccm-guard wrote it (inode, size, mtime
and ctime: any write changes the ctime, which no unprivileged process can set back), no
`.git` in the directory, and `git status --ignored` against that index reports nothing
on the work tree side: no untracked or ignored leftovers, every file as the index says.

Giving one back (a passed task, `--cleanup`) costs the person what a removal costs: the
files are renamed back to the entry's home and the admin dir goes. Resetting them to a
recent base and cleaning out leftovers runs in a detached process after ccm-guard has
exited; the entry is `returning` until then. A task's index is the agent's to write: with
stat data that hide a changed file (or `--assume-unchanged`), a change can be invisible to
git. So the reset starts from ccm-guard's copy of the index made at hand-over: every file
the task touched has a new ctime, and is rewritten.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import secrets
import shutil
import sqlite3
import stat
import time
from pathlib import Path
from typing import Any, Iterator

from . import failpoints, git, trash
from .errors import GitError, RepoError, StateError
from .registry import Registry, home
from .snapshot import Pins

LIVE_STATES = ("filling", "taking", "returning")  # a process is at work on the entry
# Everyday files a task's own git leaves in its admin dir; anything else (a sparse task's
# settings, an operation in progress) and the worktree is not taken back.
_EVERYDAY = {"HEAD", "commondir", "gitdir", "index", "logs", "ORIG_HEAD", "COMMIT_EDITMSG", "AUTO_MERGE"}

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
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS pool_repo ON pool(repo, state);
CREATE TABLE IF NOT EXISTS pool_repos (
    repo TEXT PRIMARY KEY,         -- the common dir
    size INTEGER NOT NULL,         -- how many ready entries to keep
    rev TEXT NOT NULL,             -- "a recent base": resolved when an entry is made or comes back
    key TEXT NOT NULL,             -- the repository's directory name under pool/
    main_git_dir TEXT NOT NULL,    -- where `rev` is resolved (HEAD is the person's checkout's)
    main_worktree TEXT NOT NULL
);
"""


@dataclasses.dataclass
class Entry:
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

    @property
    def index(self) -> Path:
        return Path(self.home + ".index")

    @property
    def interrupted(self) -> bool:
        """Left half-done by a process that is gone: dirty, never handed out, only destroyed."""
        return self.state in LIVE_STATES and not (self.pid is not None and pid_alive(self.pid))

    def pool_repo(self) -> git.Repo:
        """The pooled files as git sees them: the common dir's work tree, with our index."""
        return git.Repo(Path(self.repo), Path(self.repo), Path(self.path))


@dataclasses.dataclass
class RepoConfig:
    repo: str
    size: int
    rev: str
    key: str
    main_git_dir: str
    main_worktree: str


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- the tables ------------------------------------------------------------------------------


def open_registry(registry: Registry | None = None) -> Registry:
    registry = registry or Registry()
    registry.db.executescript(SCHEMA)
    return registry


def config_of(registry: Registry, repo: Path) -> RepoConfig | None:
    row = registry.db.execute("SELECT * FROM pool_repos WHERE repo = ?", (str(repo),)).fetchone()
    return RepoConfig(**dict(row)) if row else None


def entries(registry: Registry, repo: Path | None = None, states: tuple[str, ...] = ()) -> list[Entry]:
    query, args = "SELECT * FROM pool WHERE 1 = 1", []
    if repo is not None:
        query += " AND repo = ?"
        args.append(str(repo))
    if states:
        query += f" AND state IN ({', '.join('?' * len(states))})"
        args.extend(states)
    return [Entry(**dict(r)) for r in registry.db.execute(query + " ORDER BY updated_at", args).fetchall()]


def _set(registry: Registry, entry: Entry, **fields: Any) -> None:
    fields["updated_at"] = time.time()
    sets = ", ".join(f"{k} = :{k}" for k in fields)
    registry.db.execute(f"UPDATE pool SET {sets} WHERE id = :id", {**fields, "id": entry.id})
    for key, value in fields.items():
        setattr(entry, key, value)


def _insert(registry: Registry, entry: Entry) -> None:
    fields = dataclasses.asdict(entry)
    registry.db.execute(f"INSERT INTO pool ({', '.join(fields)}) VALUES ({', '.join(':' + k for k in fields)})",
                        fields)


def _drop(registry: Registry, entry: Entry) -> None:
    registry.db.execute("DELETE FROM pool WHERE id = ?", (entry.id,))
    entry.index.unlink(missing_ok=True)


def has_pool(registry: Registry, repo: Path) -> bool:
    """Whether exec should look in the pool by default: one is configured or holds entries."""
    try:
        row = registry.db.execute(
            "SELECT 1 FROM pool_repos WHERE repo = ? UNION SELECT 1 FROM pool WHERE repo = ? AND state = 'ready'",
            (str(repo), str(repo))).fetchone()
    except sqlite3.OperationalError:
        return False  # no pool was ever made: the tables do not exist
    return row is not None


@contextlib.contextmanager
def pool_lock(repo: Path) -> Iterator[None]:
    """One repository's entries change hands one process at a time (an flock: a killed
    process releases it); the registry's IMMEDIATE transaction makes each claim atomic."""
    locks = home() / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(str(repo).encode()).hexdigest()[:16]
    with open(locks / f"{name}-pool.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def _claim(registry: Registry, repo: Path, task: str | None, entry_id: str | None = None) -> Entry | None:
    """Mark a ready entry as ours (`taking`); None when there is none (or it was taken)."""
    query = "SELECT * FROM pool WHERE repo = ? AND state = 'ready'" + (" AND id = ?" if entry_id else "")
    with pool_lock(repo), registry.transaction():
        row = registry.db.execute(query + " ORDER BY updated_at DESC LIMIT 1",
                                  (str(repo), *((entry_id,) if entry_id else ()))).fetchone()
        if row is None:
            return None
        entry = Entry(**dict(row))
        _set(registry, entry, state="taking", task=task, pid=os.getpid())
    return entry


# --- what "pristine" means ---------------------------------------------------------------------


def identity(path: Path) -> str:
    st = os.lstat(path)
    return f"{stat.S_IFMT(st.st_mode)}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def problem(entry: Entry) -> str | None:
    """Why a pooled entry may not be handed out, or None when it is pristine.

    Files first, then `git status` against ccm-guard's index (the work tree side only:
    the other half compares with the common dir's HEAD, not the entry's base).
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
    leftovers = [e for e in git.status_with_index(entry.pool_repo(), entry.index)
                 if e.code in ("??", "!!") or e.code[1] != "."]
    if leftovers:
        shown = ", ".join(f"{e.code} {e.path}" for e in leftovers[:3])
        return f"{len(leftovers)} leftover(s) in its work tree: {shown}"
    return None


# --- destroying ---------------------------------------------------------------------------------


def destroy(registry: Registry, entry: Entry) -> None:
    """Remove an entry wherever its files are (its home, or the task's path they were
    renamed to), with any admin dir made for it there: into the trash, deleted after this
    process. Its row and index go too."""
    from .worktree import admin_dir_of, admin_lock

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
    _drop(registry, entry)


def forget(worktree: Path, registry: Registry | None = None) -> None:
    """A task's worktree that came from the pool was removed as usual: drop its entry."""
    if not (home() / "pool").is_dir():
        return  # no pool was ever made
    try:
        registry = open_registry(registry)
    except (sqlite3.Error, StateError):
        return
    for entry in [e for e in entries(registry) if e.path == str(worktree) and e.state == "out"]:
        _drop(registry, entry)


def out_with(worktree: Path, registry: Registry) -> Entry | None:
    found = [e for e in entries(registry, None, ("out",)) if e.path == str(worktree)]
    return found[0] if found else None


# --- handing out -------------------------------------------------------------------------------


def take(registry: Registry, repo: Path, task: str, branch: str, base: str, dest: Path) -> Path | None:
    """Hand a pristine pooled work tree to `task` as a new worktree at `dest` on a new
    `branch` at `base`. Returns its admin dir, or None when the pool has nothing to give
    (the caller makes a fresh worktree). Entries that are not pristine are destroyed here,
    never handed out.
    """
    open_registry(registry)
    while (entry := _claim(registry, repo, task)) is not None:
        failpoints.point("pool-after-claim")
        try:
            if problem(entry) is None:
                return _hand_over(registry, entry, branch, base, dest)
        except GitError:
            # Unusable (its base pruned away, say): a fresh worktree may well work.
            _undo_hand_over(repo, branch, base, dest)
        except BaseException:
            destroy(registry, entry)
            raise
        destroy(registry, entry)  # not pristine, or broken: never handed out
    return None


def _hand_over(registry: Registry, entry: Entry, branch: str, base: str, dest: Path) -> Path | None:
    from .worktree import admin_dir_of, admin_lock, host_repo

    repo = Path(entry.repo)
    try:
        with admin_lock(repo):
            git.worktree_add_bare(host_repo(repo), dest, branch, base)
    except GitError:
        # Not this entry's fault: it goes back, and the fresh worktree's own `worktree add`
        # reports what is wrong.
        _set(registry, entry, state="ready", task=None, pid=None)
        return None
    admin = admin_dir_of(dest, repo)
    _set(registry, entry, path=str(dest))  # where to look for the files if this process dies
    # The pointer git just wrote goes into the pooled directory, which takes its place.
    os.rename(dest / ".git", Path(entry.home) / ".git")
    os.rmdir(dest)
    os.rename(entry.home, dest)
    failpoints.point("pool-after-move")
    tmp = admin / "index.ccm-guard-tmp"
    shutil.copyfile(entry.index, tmp)
    os.replace(tmp, admin / "index")
    if entry.base != base:
        git.fast_forward_checkout(git.Repo(admin, repo, dest), entry.base, base)
    # ccm-guard's own copy of the index at hand-over: taking the worktree back starts from it.
    shutil.copyfile(admin / "index", entry.index)
    _set(registry, entry, state="out", fingerprint=identity(entry.index))
    return admin


def _undo_hand_over(repo: Path, branch: str, base: str, dest: Path) -> None:
    """A hand-over that failed half-way: its admin dir and branch go (the files went with
    the entry), so that the next entry, or a fresh worktree, can use the same names."""
    from .worktree import admin_lock, host_repo

    for gitdir in (repo / "worktrees").glob("*/gitdir"):
        with contextlib.suppress(OSError):
            if Path(gitdir.read_text().strip()).parent == dest:
                with admin_lock(repo):
                    trash.drop_admin(gitdir.parent, dest)
    host = host_repo(repo)
    ref = f"refs/heads/{branch}"
    if git.resolve_commit(host, ref) == base:
        git.delete_ref(host, ref, base)


# --- taking back -------------------------------------------------------------------------------


def give_back(pins: Pins, fallback_base: str, registry: Registry | None = None) -> bool:
    """Put a passed task's pooled worktree back in the pool, if the pool wants one. False:
    the pool did not take it, and the caller removes it as usual.

    Called after the task's hooks were removed. Only a worktree that came from the pool,
    whose task passed (COMMITTED or APPLIED), with ccm-guard's copy of its index intact and
    only everyday files in its admin dir, is taken back; the task's branch stays for the
    caller to delete. Here, only what a removal does: the files leave the worktree (one
    rename) and its admin dir goes. Resetting and cleaning them runs after this process
    has exited (`finish_returns`), off the person's critical path.
    """
    registry = open_registry(registry)
    entry = out_with(pins.worktree, registry)
    config = config_of(registry, pins.common_dir)
    if entry is None or config is None or not _wants_one(registry, config) or not _returnable(entry, pins, registry):
        return False
    from .worktree import admin_lock

    _set(registry, entry, state="returning", pid=os.getpid(), base=fallback_base)
    try:
        failpoints.point("pool-returning")
        os.unlink(pins.worktree / ".git")
        Path(entry.home).parent.mkdir(parents=True, exist_ok=True)
        _set(registry, entry, path=entry.home)
        os.rename(pins.worktree, entry.home)
        with admin_lock(pins.common_dir):
            trash.drop_admin(pins.admin_dir, pins.worktree)
    except OSError:
        destroy(registry, entry)
        return False  # the caller removes what is left (the admin dir)
    except BaseException:
        destroy(registry, entry)
        raise
    if not _returning:
        atexit.register(_start_finisher)
    _returning.append(entry.id)
    return True


# Entries this process gave back, for the finisher started when it exits.
_returning: list[str] = []


def _start_finisher() -> None:
    """One detached process resets and cleans what this process gave back; the entries
    name it as their worker from the start, so none of them looks interrupted."""
    import subprocess
    import sys

    ids, package_dir = list(_returning), str(Path(__file__).resolve().parent.parent)
    _returning.clear()
    code = "import sys; sys.path.insert(0, sys.argv[1]); from ccm_guard import pool; pool.finish_returns(sys.argv[2:])"
    try:
        child = subprocess.Popen([sys.executable, "-c", code, package_dir, *ids], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                 close_fds=True, cwd="/")
    except OSError:
        return  # the entries stay `returning` under a dead pid: `pool fill` destroys them
    with contextlib.suppress(sqlite3.Error, StateError):
        registry = open_registry()
        for entry_id in ids:
            registry.db.execute("UPDATE pool SET pid = ? WHERE id = ? AND state = 'returning'", (child.pid, entry_id))


def finish_returns(ids: list[str], registry: Registry | None = None) -> None:
    """Files and index of each returning entry to a recent base, leftovers cleaned,
    checked; then ready. Starts from ccm-guard's copy of the index made at hand-over."""
    registry = open_registry(registry)
    for entry in [e for e in entries(registry, None, ("returning",)) if e.id in ids]:
        try:
            failpoints.point("pool-finishing")
            config = config_of(registry, Path(entry.repo))
            base = (_recent_base(config) if config else None) or entry.base
            repo = entry.pool_repo()
            git.checkout_with_index(repo, entry.index, base)
            git.clean_with_index(repo, entry.index)
            _set(registry, entry, base=base, fingerprint=identity(entry.index))
            why = problem(entry)
            if why is not None:
                raise GitError(f"not pristine after reset and clean: {why}")
            _set(registry, entry, state="ready", task=None, pid=None)
        except (GitError, OSError):
            destroy(registry, entry)


def _returnable(entry: Entry, pins: Pins, registry: Registry) -> bool:
    try:
        if registry.get(entry.task or "").status not in ("COMMITTED", "APPLIED"):
            return False  # a task that failed a gate, or never finished, gives nothing back
        return identity(entry.index) == entry.fingerprint and set(os.listdir(pins.admin_dir)) <= _EVERYDAY
    except (OSError, StateError):
        return False


def _wants_one(registry: Registry, config: RepoConfig) -> bool:
    counted = [e for e in entries(registry, Path(config.repo), ("ready", *LIVE_STATES))
               if e.state == "ready" or (e.state != "taking" and not e.interrupted)]
    return len(counted) < config.size


def _recent_base(config: RepoConfig) -> str | None:
    main = git.Repo(Path(config.main_git_dir), Path(config.repo), Path(config.main_worktree))
    try:
        return git.resolve_commit(main, config.rev)
    except GitError:
        return None


def new_id() -> str:
    return "p-" + secrets.token_hex(4)


def pool_home(config: RepoConfig) -> Path:
    return home() / "pool" / config.key


# --- filling, draining, status ------------------------------------------------------------------


@dataclasses.dataclass
class FillReport:
    repo: str
    size: int
    base: str
    made: list[str]
    destroyed: list[str]  # dirty entries (an interrupted fill, take or return) and extra ones
    ready: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fill(main: git.Discovered, size: int, rev: str, registry: Registry | None = None) -> FillReport:
    """Keep `size` ready entries for the repository, checked out at `rev` (resolved now,
    and again whenever a worktree comes back)."""
    from .worktree import repo_key

    registry = open_registry(registry)
    repo = main.common_dir
    base = git.resolve_commit(git.Repo(main.git_dir, repo, main.toplevel), rev)
    if base is None:
        raise RepoError(f"--base {rev!r} does not name a commit in {main.toplevel}: check `git log`")
    config = RepoConfig(str(repo), size, rev, repo_key(main), str(main.git_dir), str(main.toplevel))
    registry.db.execute("INSERT OR REPLACE INTO pool_repos VALUES (?, ?, ?, ?, ?, ?)", dataclasses.astuple(config))
    destroyed = reconcile(registry, repo)
    ready = entries(registry, repo, ("ready",))
    for _ in range(len(ready) - size):
        extra = _claim(registry, repo, None)
        if extra is not None:
            destroy(registry, extra)
            destroyed.append(extra.id)
    made: list[Entry] = []
    try:
        for _ in range(size - len(ready)):
            made.append(_make(registry, config, base))
        _settle(registry, made)
    except BaseException:
        for entry in made:
            if entry.state == "filling":
                destroy(registry, entry)
        raise
    return FillReport(str(repo), size, base, [e.id for e in made], destroyed, len(entries(registry, repo, ("ready",))))


def _make(registry: Registry, config: RepoConfig, base: str) -> Entry:
    entry_id = new_id()
    where = pool_home(config) / entry_id
    entry = Entry(id=entry_id, repo=config.repo, home=str(where), path=str(where), base=base, state="filling",
                  task=None, pid=os.getpid(), fingerprint="", updated_at=time.time())
    _insert(registry, entry)
    try:
        where.mkdir(parents=True)
        git.checkout_with_index(entry.pool_repo(), entry.index, base)
    except BaseException:
        destroy(registry, entry)
        raise
    _set(registry, entry)  # updated_at: when its checkout ended
    return entry


def _settle(registry: Registry, made: list[Entry]) -> None:
    """Refresh each new index a second after its checkout (PERF-NOTES: until then every
    status re-hashes the files), record it as written, and open the entries for taking."""
    if not made:
        return
    time.sleep(max(0.0, made[-1].updated_at + 1.1 - time.time()))
    for entry in made:
        git.refresh_with_index(entry.pool_repo(), entry.index)
        _set(registry, entry, fingerprint=identity(entry.index))
        why = problem(entry)
        if why is not None:
            raise StateError(f"a new pool entry is not pristine: {why}; is something writing to {entry.path}?")
        _set(registry, entry, state="ready", pid=None)


def reconcile(registry: Registry, repo: Path) -> list[str]:
    """Destroy what interrupted processes left half-done and ready entries whose files
    went away; forget `out` entries whose worktree was removed by other means. Returns
    the ids destroyed. (`gc` may call it too.)"""
    destroyed = []
    for entry in entries(registry, repo):
        if entry.interrupted and _adopt(registry, entry):
            destroy(registry, entry)
            destroyed.append(entry.id)
        elif entry.state == "ready" and not (os.path.isdir(entry.path) and entry.index.is_file()):
            claimed = _claim(registry, repo, None, entry.id)
            if claimed is not None:
                destroy(registry, claimed)
                destroyed.append(entry.id)
        elif entry.state == "out" and not os.path.lexists(entry.path):
            _drop(registry, entry)
    return destroyed


def _adopt(registry: Registry, entry: Entry) -> bool:
    """Take over an entry whose process died; False if another process got there first."""
    with registry.transaction():
        cursor = registry.db.execute("UPDATE pool SET pid = ?, updated_at = ? WHERE id = ? AND pid IS ?",
                                     (os.getpid(), time.time(), entry.id, entry.pid))
    return cursor.rowcount == 1


@dataclasses.dataclass
class DrainReport:
    repo: str
    destroyed: list[str]
    left_with_tasks: list[str]  # out with a task: removed (not returned) when the task is

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def drain(repo: Path, registry: Registry | None = None) -> DrainReport:
    """Destroy every ready entry of the repository and stop keeping any."""
    registry = open_registry(registry)
    registry.db.execute("DELETE FROM pool_repos WHERE repo = ?", (str(repo),))
    destroyed = reconcile(registry, repo)
    while (entry := _claim(registry, repo, None)) is not None:
        destroy(registry, entry)
        destroyed.append(entry.id)
    out = [e.id for e in entries(registry, repo, ("out", *LIVE_STATES))]
    return DrainReport(str(repo), destroyed, out)


def status(registry: Registry | None = None, repo: Path | None = None) -> list[dict[str, Any]]:
    """Per repository: how many entries it keeps, and each with what it is doing."""
    registry = open_registry(registry)
    configs = {r["repo"]: RepoConfig(**dict(r)) for r in registry.db.execute("SELECT * FROM pool_repos")}
    names = sorted({*configs, *(e.repo for e in entries(registry))})
    found = []
    for name in [n for n in names if repo is None or n == str(repo)]:
        config = configs.get(name)
        listed = [describe(registry, e) for e in entries(registry, Path(name))]
        found.append({"repo": name, "size": config.size if config else 0, "rev": config.rev if config else None,
                      "ready": sum(1 for e in listed if e["state"] == "ready"),
                      "dirty": sum(1 for e in listed if e["dirty"]), "entries": listed})
    return found


def describe(registry: Registry, entry: Entry) -> dict[str, Any]:
    data = dataclasses.asdict(entry)
    data.pop("fingerprint")
    note, dirty = "", entry.interrupted
    if dirty:
        note = f"interrupted while {entry.state} (pid {entry.pid} is gone): dirty, `pool fill` destroys it"
    elif entry.state == "out":
        note, dirty = _out_note(registry, entry)
    data.update(dirty=dirty, note=note)
    return data


def _out_note(registry: Registry, entry: Entry) -> tuple[str, bool]:
    try:
        task = registry.get(entry.task or "")
    except StateError:
        return f"out with task {entry.task}, which the registry no longer has: dirty, not pooled", True
    if task.abandoned:
        return (f"out with task {task.id}, whose ccm-guard process (pid {task.pid}) is gone: dirty, not pooled; "
                "it goes when the task is discarded"), True
    return f"out with task {task.id} ({task.status})", False
