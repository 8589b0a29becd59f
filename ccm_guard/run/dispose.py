"""After the verdict: keep the task, apply it, or archive and remove it, and say what next."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
from pathlib import Path

from ccm_guard import git, worktree
from ccm_guard.agent.options import ExecOptions
from ccm_guard.detect.verdict import Verdict
from ccm_guard.errors import GitError, GuardError
from ccm_guard.files import read_regular
from ccm_guard.prevent import arm as prevention
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry, Task


def dispose(verdict: Verdict, opts: ExecOptions, task: Task, pins: Pins, host: git.Repo, registry: Registry) -> None:
    """Keep, or archive and remove; record the outcome. Nothing is removed unarchived."""
    quarantine(verdict, pins.common_dir, Path(task.log_dir))
    if verdict.config_plants:
        others = [t.id for t in registry.at_work(task.repo, task.created_at) if t.id != task.id]
        unset_config_plants(verdict, pins.common_dir, Path(task.log_dir), others)
    if verdict.blocked:
        registry.move(task.id, "BLOCKED")
        verdict.disposition = "kept: the agent is blocked on a question"
        verdict.next_steps = [f"answer, then: ccm-guard task resume {task.id} -- <agent command>",
                              f"or give up:   ccm-guard task discard {task.id}"]
        registry.update(task.id, verdict=json.dumps(verdict.to_json()))
        return
    passed = verdict.exit_code == 0
    registry.move(task.id, "COMMITTED" if passed else "ERRORED", verdict=json.dumps(verdict.to_json()))
    every = opts.snapshot_every or 0
    if verdict.git_trusted and verdict.head and 0 < every <= len(verdict.commits):
        from ccm_guard.worktree.rollback import (
            auto_snapshots,  # only when a snapshot is due
        )

        with contextlib.suppress(GitError):
            auto_snapshots(registry, host, task, verdict.head, every, commits=verdict.commits)
    if passed and opts.apply and verdict.head and verdict.head != task.base:
        _apply_on_pass(verdict, task, registry)
        passed = verdict.exit_code == 0
    remove = opts.cleanup if passed else opts.on_fail == "discard"
    if remove:
        _archive_and_remove(verdict, task, pins, host)
        if verdict.disposition.startswith("removed"):
            registry.set_option(task.id, "archive", {"ref": verdict.archive, "head": verdict.head or task.base})
            registry.move(task.id, "CLEANED_UP" if passed else "DISCARDED")
    verdict.next_steps = next_steps(verdict, task)
    registry.update(task.id, verdict=json.dumps(verdict.to_json()))


def quarantine(verdict: Verdict, common: Path, log_dir: Path) -> None:
    """Move what the run planted (verdict.plants) into the task's logs, so that the
    person's first `git status` in the kept worktree, or in their checkout, runs none of
    it. Moved, never deleted: the person can see exactly what the agent left."""
    aside = log_dir / "quarantine"
    for rel in verdict.plants:
        source, target = common / rel, aside / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.rename(source, target)  # a link moves as a link; nothing is followed
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                _move_across(source, target)
        except OSError as exc:
            verdict.errors.append(f"could not move {source} aside ({exc.strerror}): do not run git there "
                                  "before removing it by hand")
            continue
        verdict.notes.append(f"moved {rel} (left by the agent) out of the git metadata into {target}")


def unset_config_plants(verdict: Verdict, common: Path, log_dir: Path, others_at_work: list[str]) -> None:
    """Unset the keys that run code which the run left in the repository's own config
    (verdict.config_plants), after writing down how to put each back. Not while another
    task is at work on the repository (asked again now: one may have started since the
    run was judged; its agent may be the planter, and it took its baseline with the key);
    only where the file still says what the run left (the person may have changed it
    since) and is a plain file (git's lock follows a link)."""
    from ccm_guard.detect.snapshot import CONFIG_LIMIT
    from ccm_guard.git import config as configfile

    plants = [(common / p["file"], str(p["key"]), tuple(p["values"])) for p in verdict.config_plants]
    if not plants:
        return

    def by_hand(path: Path, key: str) -> str:
        return f"git config --file {shlex.quote(str(path))} --unset-all {shlex.quote(key)}"

    if others_at_work:
        for path, key, _ in plants:
            verdict.notes.append(f"{key} in {path} runs code and was set during the run; another task "
                                 f"({', '.join(others_at_work[:3])}) was at work on the repository, so it was left "
                                 f"as it is: remove it yourself ({by_hand(path, key)}) unless you set it")
        return
    due = []
    for path, key, values in plants:
        data = read_regular(path, CONFIG_LIMIT)
        if data is None or configfile.values_of(data, key) != values:
            verdict.notes.append(f"{key} in {path} runs code and was set during the run; it was left as it is "
                                 f"(the file changed since): remove it yourself ({by_hand(path, key)}) unless you set it")
        else:
            due.append((path, key, values))
    if not due:
        return
    lines = [f"git config --file {shlex.quote(str(path))} --add {shlex.quote(key)} {shlex.quote(v)}\n"
             for path, key, values in due for v in values]
    try:
        script = _write_new(log_dir / "quarantine", "config-keys", ".sh",
                            "# Set in the repository's config during the run and unset by ccm-guard;\n"
                            "# to put back what you set yourself, run the line for it:\n" + "".join(lines))
    except OSError as exc:
        verdict.errors.append(f"could not record the keys that run code before unsetting them ({exc.strerror}): "
                              "remove them yourself: " + "; ".join(by_hand(p, k) for p, k, _ in due))
        return
    for path, key, _ in due:
        try:
            configfile.config_file_set(path, key, None)
            data = read_regular(path, CONFIG_LIMIT)
            still = data is None or configfile.values_of(data, key) != ()
        except GitError:
            still = True
        if still:  # git could not take its lock (a config.lock left behind), or the file went
            verdict.errors.append(f"could not unset {key} in {path}: remove it before you run git there "
                                  f"({by_hand(path, key)})")
        else:
            verdict.notes.append(f"unset {key} in {path} (set during the run; it runs code): how to put it back "
                                 f"is in {script}")


def _write_new(directory: Path, stem: str, suffix: str, text: str) -> Path:
    """A new file of the task's logs (`stem.suffix`, else `stem.2.suffix`, ...), created
    exclusively and through no link: nothing the agent left there ends up in it."""
    directory.mkdir(parents=True, exist_ok=True)
    if directory.is_symlink():
        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), str(directory))
    for n in range(1, 100):
        path = directory / (f"{stem}{suffix}" if n == 1 else f"{stem}.{n}{suffix}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        return path
    raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), str(directory))


def _move_across(source: Path, target: Path) -> None:
    """rename(2) across file systems: a link is recorded as its target's name, a file copied."""
    if source.is_symlink():
        target.with_name(target.name + ".link").write_text(os.readlink(source) + "\n")
    else:
        data = read_regular(source, 16 << 20)
        target.write_bytes(data if data is not None else b"(not a regular file)\n")
    source.unlink()


def _apply_on_pass(verdict: Verdict, task: Task, registry: Registry) -> None:
    from ccm_guard.worktree import apply as applying

    try:
        verdict.applied = applying.apply_task(registry, task.id).to_json()
    except GuardError as exc:
        verdict.apply_refused = exc.message


def _archive_and_remove(verdict: Verdict, task: Task, pins: Pins, host: git.Repo) -> None:
    if not verdict.git_trusted:
        verdict.disposition = "kept: its git metadata was tampered with, so ccm-guard ran no git to archive it"
        return
    repo = git.Repo(pins.admin_dir, pins.common_dir, pins.worktree)
    clean = any(g.name == "clean-tree" and g.status == "pass" for g in verdict.gates)
    try:
        verdict.archive = worktree.archive(repo, host, task.id, task.base, verdict.head or task.base, clean)
    except GitError as exc:
        verdict.disposition = "kept: the archive could not be made, so nothing was removed"
        verdict.errors.append(exc.message)
        return
    try:
        with contextlib.suppress(GuardError, OSError):
            prevention.disarm(pins)  # its hooks live under the state home, not in the worktree
        # Only a passed task's worktree may go back to the warm pool.
        pooled = worktree.remove(host, pins, verdict.head, reuse=verdict.exit_code == 0)
    except GitError as exc:
        verdict.disposition = "kept: archived, but removing the worktree failed"
        verdict.errors.append(exc.message)
        return
    verdict.disposition = "removed after archiving" if verdict.archive else "removed (no work to keep)"
    if pooled:
        verdict.disposition += "; the worktree went back to the warm pool"


def next_steps(v: Verdict, task: Task) -> list[str]:
    """What the person can do next, each a command that works as printed (after the label)
    from anywhere: ccm-guard finds the task by its id."""
    if v.disposition.startswith("removed"):
        return [f"restore: ccm-guard task restore {task.id}"] if v.archive else []
    if v.applied:
        return [f"review: git -C {task.main_worktree} log -p {v.applied['old'][:12]}..{v.applied['new'][:12]}",
                f"undo:   ccm-guard task rollback {task.id}"]
    if v.exit_code == 0 and v.head and v.head != task.base:
        return [f"review: ccm-guard task diff {task.id}", f"apply:  ccm-guard task apply {task.id}"]
    if not v.git_trusted:  # any git run there (a prompt showing the branch, too) may run the agent's code
        unset = " (the keys the notes say ccm-guard unset are done)" if v.config_plants else ""
        return [f"first:   run no git in {task.main_worktree} or the task's worktree; undo by hand what git-metadata "
                f"names in {task.repo} (edit the files; `git config` itself is safe){unset}",
                f"then:    ccm-guard audit {task.id}   (judges the run again; discard works once it is safe)"]
    return [f"inspect: cd {v.worktree}   (logs in {v.log_dir})", f"check again: ccm-guard audit {task.id}",
            f"discard: ccm-guard task discard {task.id}   (archived first; task restore brings it back)"]
