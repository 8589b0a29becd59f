"""The task registry: one SQLite file under the state home, outside every worktree.

WAL and a busy timeout let many ccm-guard processes (many agents at once) share it.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
import sqlite3
import time
import weakref
from pathlib import Path
from typing import Any, Callable

from ccm_guard.errors import StateError, UsageError
from ccm_guard.state.home import home

SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (
    id TEXT PRIMARY KEY,
    repo TEXT NOT NULL,            -- the common dir (real path)
    main_worktree TEXT NOT NULL,   -- the person's checkout exec was started from
    main_git_dir TEXT NOT NULL,
    worktree TEXT NOT NULL,
    admin_dir TEXT NOT NULL DEFAULT '',
    branch TEXT NOT NULL,
    base TEXT NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    pid INTEGER,
    command TEXT NOT NULL DEFAULT '[]',
    log_dir TEXT NOT NULL DEFAULT '',
    baseline TEXT,                 -- path of the snapshot taken before the agent started
    verdict TEXT,                  -- the last verdict, as JSON
    options TEXT NOT NULL DEFAULT '{}'  -- what the run is judged by: role, read_only, ...
);
CREATE INDEX IF NOT EXISTS tasks_repo ON tasks(repo, status);
CREATE INDEX IF NOT EXISTS tasks_updated ON tasks(repo, updated_at);
"""

# The lifecycle (docs/design-notes.md#the-task-lifecycle); anything else is a bug or a race, and refused.
RESTORED = {"COMMITTED", "ERRORED", "BLOCKED", "ROLLED_BACK"}  # `task restore`: back to where it was
TRANSITIONS: dict[str, set[str]] = {
    "PENDING": {"CREATED", "ERRORED", "CLEANED_UP"},
    "CREATED": {"ACTIVE", "ERRORED", "DISCARDED", "CLEANED_UP"},
    "ACTIVE": {"COMMITTED", "BLOCKED", "ERRORED", "ROLLED_BACK", "DISCARDED", "CLEANED_UP"},
    "BLOCKED": {"ACTIVE", "DISCARDED", "ERRORED", "ROLLED_BACK"},
    "COMMITTED": {"APPLIED", "DISCARDED", "ROLLED_BACK", "CLEANED_UP", "ACTIVE"},
    "ERRORED": {"DISCARDED", "CLEANED_UP", "ACTIVE", "ROLLED_BACK", "COMMITTED"},  # COMMITTED: `audit --accept`
    "APPLIED": {"CLEANED_UP", "ROLLED_BACK"},
    "ROLLED_BACK": {"ACTIVE", "DISCARDED", "CLEANED_UP"},
    "DISCARDED": {"CLEANED_UP", *RESTORED},
    "CLEANED_UP": {"APPLIED", *RESTORED},
}
# A task's strategy, as recorded in its options (older rows have none: a linked worktree).
LINKED_WORKTREE = "worktree"
COPIED_DIRECTORY = "copy"

RUNNING = ("PENDING", "CREATED", "ACTIVE")  # a ccm-guard process holds the task
LIVE = ("PENDING", "CREATED", "ACTIVE", "BLOCKED", "COMMITTED", "ERRORED")


@dataclasses.dataclass
class Task:
    """One task's registry row."""

    id: str
    repo: str
    main_worktree: str
    main_git_dir: str
    worktree: str
    admin_dir: str
    branch: str
    base: str
    status: str
    created_at: float
    updated_at: float
    pid: int | None
    command: str
    log_dir: str
    baseline: str | None
    verdict: str | None
    options: str = "{}"

    @property
    def abandoned(self) -> bool:
        """Still marked as running, but the ccm-guard process that ran it is gone."""
        return self.status in RUNNING and self.pid is not None and not pid_alive(self.pid)

    @property
    def running(self) -> bool:
        """A ccm-guard process is at work on it: hands off."""
        return self.status in RUNNING and not self.abandoned

    def option_dict(self) -> dict[str, Any]:
        data = json.loads(self.options or "{}")
        return data if isinstance(data, dict) else {}

    def ccm_commits(self) -> tuple[str, ...]:
        """Commits ccm-guard itself made for this task: its recovery commits on the task's
        branch, and the commit its apply landed. A commit claiming to be ccm-guard's is
        excused by this record alone (kept in the registry, out of a sandboxed agent's reach)."""
        recovered = self.option("ccm_commits")  # run/judge.record_commit writes it
        applied = self.option("applied")
        return (tuple(c for c in recovered if isinstance(c, str)) if isinstance(recovered, list) else ()) + \
            ((applied["new"],) if isinstance(applied, dict) and isinstance(applied.get("new"), str) else ())

    def option(self, key: str) -> Any:
        return self.option_dict().get(key)

    @property
    def strategy(self) -> str:
        """How the task's sandbox was made: LINKED_WORKTREE, or COPIED_DIRECTORY for a folder without git."""
        return str(self.option("strategy") or LINKED_WORKTREE)

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["abandoned"] = self.abandoned
        data["command"] = json.loads(self.command)
        data["verdict"] = json.loads(self.verdict) if self.verdict else None
        data["options"] = json.loads(self.options or "{}")
        return data


def in_flight(pending: dict[str, Any]) -> bool:
    """The apply or rollback that wrote `pending` is still at work (another live process):
    it records its own outcome; judging it now would race it."""
    pid = pending.get("pid")
    return isinstance(pid, int) and pid != os.getpid() and pid_alive(pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # somebody else's process: alive
    # An exited process its parent has not reaped yet (a zombie) still answers kill(0),
    # but it holds nothing and will do no more work: count it dead. (A long-lived parent
    # that runs exec in-process, or set itself up as a subreaper, leaves such zombies.)
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


REGISTRY_WAIT = 30.0  # seconds a command waits for another ccm-guard process's hold on the registry


def _wait_for(lock: Any, name: Path) -> None:
    """flock with a bound: a process that holds the open lock and hangs must not block
    every command for ever (a dead holder's lock is released by the kernel)."""
    deadline = time.monotonic() + REGISTRY_WAIT
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StateError(f"another ccm-guard process has held {name} for over {REGISTRY_WAIT:.0f} s: "
                                 "wait for it to finish (`ps -ef | grep ccm-guard`), or stop it, then run "
                                 "this again") from None
            time.sleep(0.05)


class Registry:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path or home() / "registry.db"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Switching to WAL and creating the schema do not wait for a busy database the
            # way queries do: ten processes opening a new registry at once fail without this.
            with open(self.path.parent / "registry.open.lock", "w") as lock:
                _wait_for(lock, self.path.parent / "registry.open.lock")
                self.db = sqlite3.connect(self.path, timeout=REGISTRY_WAIT, isolation_level=None)
                self.db.execute("PRAGMA busy_timeout = 30000")
                self.db.execute("PRAGMA journal_mode = WAL")
                # With WAL, NORMAL cannot corrupt the file; it only skips an fsync per transaction.
                self.db.execute("PRAGMA synchronous = NORMAL")
                self.db.executescript(SCHEMA)
                self._migrate()
        except sqlite3.DatabaseError as exc:
            if any(sign in str(exc) for sign in ("not a database", "malformed", "no such column", "no such table")):
                raise StateError(f"the task registry {self.path} is damaged ({exc}): move it aside (mv {self.path} "
                                 f"{self.path}.damaged) and run again; a new one is started, and every task's work "
                                 "stays in its branch or refs/ccm-guard/archive/") from exc
            raise StateError(f"cannot open the task registry {self.path}: {exc}; check $CCM_GUARD_HOME") from exc
        except (OSError, sqlite3.Error) as exc:
            raise StateError(f"cannot open the task registry {self.path}: {exc}; check $CCM_GUARD_HOME") from exc
        self.db.row_factory = sqlite3.Row
        # Closed when dropped or at the process's exit, however it leaves (cli.run skips
        # the interpreter's teardown): the last connection folds the WAL into the file.
        self._closer = weakref.finalize(self, self.db.close)

    def close(self) -> None:
        self._closer()

    def _migrate(self) -> None:
        """Registries made by an earlier version lack later columns; add them."""
        have = {row[1] for row in self.db.execute("PRAGMA table_info(tasks)")}
        if "options" not in have:
            self.db.execute("ALTER TABLE tasks ADD COLUMN options TEXT NOT NULL DEFAULT '{}'")

    def add(self, task: Task) -> None:
        fields = dataclasses.asdict(task)
        names = ", ".join(fields)
        marks = ", ".join(f":{k}" for k in fields)
        try:
            self.db.execute(f"INSERT INTO tasks ({names}) VALUES ({marks})", fields)
        except sqlite3.IntegrityError as exc:
            raise StateError(f"task {task.id} already exists: pick another --task id") from exc

    def get(self, task_id: str) -> Task:
        row = self.db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
        if row is None:
            raise StateError(f"no task {task_id!r}: `ccm-guard task list --all` shows the known ones")
        return Task(**dict(row))

    def exists(self, task_id: str) -> bool:
        return self.db.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone() is not None

    def at_work(self, repo: str, since: float) -> list[Task]:
        """Tasks of `repo` running now, or whose state changed at or after `since` (finished,
        cleaned up or applied meanwhile): what may have acted on the repository meanwhile."""
        return [t for t in self.list(repo=repo, since=since) if t.status in RUNNING or t.updated_at >= since]

    def list(self, *, repo: str | None = None, live_only: bool = True, since: float | None = None) -> list[Task]:
        """Tasks by creation; `live_only`: the LIVE ones; `since`: the LIVE ones and any
        updated at or after that time (what a run must know of its neighbours, without
        reading every task the repository ever had)."""
        mine, of_repo = ("repo = ? AND ", [repo]) if repo else ("", [])
        live = f"status IN ({', '.join('?' * len(LIVE))})"
        if since is not None:
            # Two indexed lookups joined: an OR across two columns would read every row
            # the repository ever had (10k finished tasks cost 17 ms on every exec).
            query = (f"SELECT * FROM tasks WHERE {mine}{live} UNION "
                     f"SELECT * FROM tasks WHERE {mine}updated_at >= ?")
            args: list[object] = [*of_repo, *LIVE, *of_repo, since]
        elif live_only:
            query, args = f"SELECT * FROM tasks WHERE {mine}{live}", [*of_repo, *LIVE]
        else:
            query, args = f"SELECT * FROM tasks{' WHERE repo = ?' if repo else ''}", [*of_repo]
        rows = self.db.execute(query + " ORDER BY created_at", args).fetchall()
        return [Task(**dict(r)) for r in rows]

    def update(self, task_id: str, **fields: Any) -> None:
        fields["updated_at"] = time.time()
        sets = ", ".join(f"{k} = :{k}" for k in fields)
        _write(self.db, f"UPDATE tasks SET {sets} WHERE id = :id", {**fields, "id": task_id})

    def check_move(self, task_id: str, status: str) -> None:
        """Refuse an illegal status change before doing the work it would record."""
        current = self.get(task_id).status
        if status not in TRANSITIONS[current]:
            raise StateError(f"task {task_id} cannot go from {current} to {status}")

    def move(self, task_id: str, status: str, **fields: Any) -> None:
        """Change a task's status along the lifecycle, atomically against other processes."""
        with self.transaction():
            self.check_move(task_id, status)
            self.update(task_id, status=status, **fields)

    def edit_options(self, task_id: str, edit: Callable[[Task, dict[str, Any]], bool], **fields: Any) -> bool:
        """Change a task's `options` in one transaction (another process may be changing
        the same row): `edit` is given the task as stored and its options, changes the
        options in place, and says whether they are to be written, with `fields` (a
        `status` among them is checked against the lifecycle). Whether they were."""
        with self.transaction():
            task = self.get(task_id)
            options = task.option_dict()
            if not edit(task, options):
                return False
            if "status" in fields:
                self.check_move(task_id, fields["status"])
            self.update(task_id, options=json.dumps(options), **fields)
        return True

    def set_option(self, task_id: str, key: str, value: Any) -> None:
        """Record one fact about a task (its archive, an apply in flight, ...) in `options`;
        None removes it."""
        def put(_: Task, options: dict[str, Any]) -> bool:
            if value is None:
                options.pop(key, None)
            else:
                options[key] = value
            return True

        self.edit_options(task_id, put)

    def claim_option(self, task_id: str, key: str, value: dict[str, Any], *, status: str) -> bool:
        """Record `value` (a move in flight, with this process's pid) under `key`, in one
        transaction, only while the task is still `status` and no other live process has a
        record there: False otherwise (two applies of one task at once both landed)."""
        def claim(task: Task, options: dict[str, Any]) -> bool:
            held = options.get(key)
            if task.status != status or (isinstance(held, dict) and in_flight(held)):
                return False
            options[key] = value
            return True

        return self.edit_options(task_id, claim)

    def drop_option_if(self, task_id: str, key: str, expected: Any) -> bool:
        """Remove `key` from a task's options only while it still holds `expected` (another
        process may have written its own meanwhile); whether it did."""
        def drop(_: Task, options: dict[str, Any]) -> bool:
            if options.get(key) != expected:
                return False
            options.pop(key, None)
            return True

        return self.edit_options(task_id, drop)

    def merge_option(self, task_id: str, key: str, values: dict[str, Any]) -> None:
        """Add `values` to the mapping a task keeps under `key` in `options`, in one transaction."""
        def merge(_: Task, options: dict[str, Any]) -> bool:
            options[key] = {**(options.get(key) or {}), **values}
            return True

        self.edit_options(task_id, merge)

    def delete(self, task_id: str) -> None:
        _write(self.db, "DELETE FROM tasks WHERE id = ?", (task_id,))

    def transaction(self) -> "_Tx":
        return _Tx(self.db)


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        _write(self.db, "BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *_: object) -> None:
        if kind is None:
            try:
                _write(self.db, "COMMIT")
                return
            except StateError:
                self.db.rollback()
                raise
        self.db.execute("ROLLBACK")


def _write(db: sqlite3.Connection, sql: str, params: Any = ()) -> None:
    """A write that fails (a full disk, a broken file) is a StateError with the fix, not a traceback."""
    try:
        db.execute(sql, params)
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise StateError(f"the task registry stayed locked by another ccm-guard process for "
                             f"{REGISTRY_WAIT:.0f} s: wait for it to finish, or stop it, then run this again") from exc
        raise StateError(f"the task registry could not be written ({exc}): free disk space under "
                         f"{home()} or check the file") from exc


def new_task_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + os.urandom(2).hex()


def sanitise_task_id(raw: str) -> str:
    """A task id that is safe as a path component, a branch name and a shell word."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", raw)
    cleaned = re.sub(r"-{2,}", "-", cleaned)
    cleaned = re.sub(r"\.{2,}", ".", cleaned).strip("-.")[:64].rstrip("-.")
    if cleaned.endswith(".lock"):
        cleaned = cleaned[: -len(".lock")] + "-lock"
    if not cleaned:
        raise UsageError(f"task id {raw!r} has no usable characters: use letters, digits, '.', '_' or '-'")
    return cleaned
