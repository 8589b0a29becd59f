"""The `pool` command's side of the warm pool: fill, drain, status, and reconciling what
interrupted processes left half-done. Taking and giving back entries: `pool/__init__.py`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import Any, Iterator

from ccm_guard import failpoints, git, progress
from ccm_guard.errors import RepoError, StateError
from ccm_guard.pool.records import (
    LIVE_STATES,
    Entry,
    RepoConfig,
    claim,
    config_from,
    config_of,
    destroy,
    drop,
    entries,
    identity,
    insert,
    open_registry,
    problem,
    record_proof,
    set_fields,
)
from ccm_guard.state.home import home, repo_key
from ccm_guard.state.registry import Registry


def new_id() -> str:
    return "p-" + os.urandom(4).hex()


def pool_home(config: RepoConfig) -> Path:
    return home() / "pool" / config.key


@dataclasses.dataclass
class FillReport:
    """What a pool fill made."""

    repo: str
    size: int
    base: str
    made: list[str]
    destroyed: list[str]  # dirty entries (an interrupted fill, take or return) and extra ones
    ready: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def fill(main: git.Discovered, size: int, rev: str, registry: Registry | None = None,
         refill: bool | None = None) -> FillReport:
    """Keep `size` ready entries for the repository, checked out at `rev` (resolved now,
    and again whenever a worktree comes back); with `refill` (None: as before, else on),
    a taken entry is replaced in the background."""


    registry = open_registry(registry)
    repo = main.common_dir
    base = git.resolve_commit(git.Repo(main.git_dir, repo, main.toplevel), rev)
    if base is None:
        raise RepoError(f"--base {rev!r} does not name a commit in {main.toplevel}: check `git log`")
    with sizing(repo):
        if refill is None:
            before = config_of(registry, repo)
            refill = bool(before.refill) if before else True
        config = RepoConfig(str(repo), size, rev, repo_key(main), str(main.git_dir), str(main.toplevel), int(refill))
        names = [f.name for f in dataclasses.fields(RepoConfig)]
        registry.db.execute(f"INSERT OR REPLACE INTO pool_repos ({', '.join(names)}) "
                            f"VALUES ({', '.join('?' * len(names))})", dataclasses.astuple(config))
        destroyed = reconcile(registry, repo) + trim(registry, config)
        made = make(registry, config, base, missing(registry, config))
    return FillReport(str(repo), size, base, [e.id for e in made], destroyed, len(entries(registry, repo, ("ready",))))


@contextlib.contextmanager
def sizing(repo: Path) -> Iterator[None]:
    """One process at a time changes how many entries a repository's pool has (fill,
    drain, the background refiller, a returned worktree made ready): each counts what
    the one before it left."""
    from ccm_guard.state.home import admin_lock

    with admin_lock(repo, "pool-size"):
        yield


def counted(registry: Registry, config: RepoConfig) -> list[Entry]:
    """Entries that are, or are on their way to being, ready (a take in progress is not)."""
    return [e for e in entries(registry, Path(config.repo), ("ready", *LIVE_STATES))
            if e.state == "ready" or (e.state != "taking" and not e.interrupted)]


def missing(registry: Registry, config: RepoConfig) -> int:
    return max(0, config.size - len(counted(registry, config)))


def trim(registry: Registry, config: RepoConfig) -> list[str]:
    """Destroy ready entries beyond the pool's size; their ids."""
    destroyed = []
    for _ in range(len(counted(registry, config)) - config.size):
        extra = claim(registry, Path(config.repo), None)
        if extra is None:
            break
        destroy(registry, extra)
        destroyed.append(extra.id)
    return destroyed


def make(registry: Registry, config: RepoConfig, base: str, count: int) -> list[Entry]:
    """`count` new ready entries at `base`; on any failure none of them is left half-made."""
    made: list[Entry] = []
    try:
        for number in range(1, count + 1):
            with progress.step(f"making pool worktree {number} of {count}"):
                made.append(_make(registry, config, base))
        failpoints.point("pool-before-settle")
        _settle(registry, made)
    except BaseException:
        for entry in made:
            if entry.state == "filling":
                destroy(registry, entry)
        raise
    return made


def _make(registry: Registry, config: RepoConfig, base: str) -> Entry:
    entry_id = new_id()
    where = pool_home(config) / entry_id
    entry = Entry(id=entry_id, repo=config.repo, home=str(where), path=str(where), base=base, state="filling",
                  task=None, pid=os.getpid(), fingerprint="", updated_at=time.time())
    insert(registry, entry)
    try:
        where.mkdir(parents=True)
        git.checkout_with_index(entry.pool_repo(), entry.index, base)
    except BaseException:
        destroy(registry, entry)
        raise
    set_fields(registry, entry)  # updated_at: when its checkout ended
    return entry


def _settle(registry: Registry, made: list[Entry]) -> None:
    """Refresh each new index a second after its checkout (until then every status
    re-hashes the files: docs/design-notes.md#the-racily-clean-index), record it as written, and open the entries for taking."""
    if not made:
        return
    time.sleep(max(0.0, made[-1].updated_at + 1.1 - time.time()))
    for entry in made:
        git.refresh_with_index(entry.pool_repo(), entry.index)
        set_fields(registry, entry, fingerprint=identity(entry.index))
        record_proof(registry, entry)
        why = problem(entry)
        if why is not None:
            raise StateError(f"a new pool entry is not pristine: {why}; is something writing to {entry.path}?")
        set_fields(registry, entry, state="ready", pid=None)


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
            claimed = claim(registry, repo, None, entry.id)
            if claimed is not None:
                destroy(registry, claimed)
                destroyed.append(entry.id)
        elif entry.state == "out" and not os.path.lexists(entry.path):
            drop(registry, entry)
    return destroyed


def _adopt(registry: Registry, entry: Entry) -> bool:
    """Take over an entry whose process died; False if another process got there first."""
    with registry.transaction():
        cursor = registry.db.execute("UPDATE pool SET pid = ?, updated_at = ? WHERE id = ? AND pid IS ?",
                                     (os.getpid(), time.time(), entry.id, entry.pid))
    return cursor.rowcount == 1


@dataclasses.dataclass
class DrainReport:
    """What a pool drain removed, and what it left out with a task."""

    repo: str
    destroyed: list[str]
    left_with_tasks: list[str]  # out with a task: removed (not returned) when the task is

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def drain(repo: Path, registry: Registry | None = None) -> DrainReport:
    """Destroy every ready entry of the repository and stop keeping any (after a refill
    that is under way, which is waited for)."""
    registry = open_registry(registry)
    with sizing(repo):
        registry.db.execute("DELETE FROM pool_repos WHERE repo = ?", (str(repo),))
        destroyed = reconcile(registry, repo)
        while (entry := claim(registry, repo, None)) is not None:
            destroy(registry, entry)
            destroyed.append(entry.id)
    out = [e.id for e in entries(registry, repo, ("out", *LIVE_STATES))]
    return DrainReport(str(repo), destroyed, out)


def status(registry: Registry | None = None, repo: Path | None = None) -> list[dict[str, Any]]:
    """Per repository: how many entries it keeps, and each with what it is doing."""
    registry = open_registry(registry)
    configs = {r["repo"]: config_from(r) for r in registry.db.execute("SELECT * FROM pool_repos")}
    names = sorted({*configs, *(e.repo for e in entries(registry))})
    found = []
    for name in [n for n in names if repo is None or n == str(repo)]:
        config = configs.get(name)
        listed = [describe(registry, e) for e in entries(registry, Path(name))]
        found.append({"repo": name, "size": config.size if config else 0, "rev": config.rev if config else None,
                      "refill": bool(config.refill) if config else False,
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


