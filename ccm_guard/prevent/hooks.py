"""Installing ccm-guard's git hooks: for one task worktree, or for a whole repository.

The hook scripts and the task settings file they read are hookfiles.py's; the git
config install changes, and how uninstall puts it back, hookconfig.py's.

**A task worktree** (`install_worktree`; `ccm-guard exec` does it for each task, and
takes the snapshot baseline afterwards): `extensions.worktreeConfig=true` in the
shared config if it is not already, and `core.hooksPath` in that worktree's own
`config.worktree`, so the person's checkout and every other worktree keep their own
hooks. The hooks dir is ccm-guard's, under the state home
(`$CCM_GUARD_HOME/hooks/<repo>/worktrees/<admin dir name>/`), not under the
worktree's admin dir: the agent must be able to write its admin dir (index, HEAD,
logs), and the sandbox grants whole directories, so anything in there would be the
agent's to edit, whereas the state home is read-only to it. With no sandbox the agent
can edit anything anyway: these hooks are prevention, the snapshots are the
authority. The task's settings file sits beside the hooks (format: `write_settings`).
The hooks this worktree used before (the repository's `core.hooksPath`, else
`<common>/hooks`) stay where they are and are chained by their own path, so tools
that find their files from `$0` (husky) keep working; hooks ccm-guard has nothing to
decide in get a chain-only script.

**A whole repository** (`install_repo`): our hooks go into `<common>/hooks`, an
existing hook is kept beside them as `<hook>.ccm-guard.legacy` and chained. Not
`<hook>.legacy`: that is the pre-commit framework's own name for the hook it
replaced, and a pre-commit script renamed to `pre-commit.legacy` runs itself as its
own legacy hook and fails. Those hooks act only in task worktrees (a worktree with
settings under the state home), so they also hold when an agent drops its worktree's
`core.hooksPath`. With `core.hooksPath` already set, hooks in `<common>/hooks` would
never run: refused, or with `force` a ccm-guard hooks dir becomes the local
`core.hooksPath` and chains the old one in place (husky's files stay untouched).
`uninstall_repo` puts back exactly what was there, bytes and modes.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any, Sequence

from ccm_guard import git
from ccm_guard.errors import NotARepository, RepoError, UsageError
from ccm_guard.prevent.hookconfig import (
    config_edit,
    config_get,
    config_undo,
    disable_worktree_config,
    enable_worktree_config,
    hooks_path_setting,
    repo_hooks_dir,
    user_config_files,
)
from ccm_guard.prevent.hookfiles import (
    GUARD_HOOKS,
    is_ours,
    write_chaining_dir,
    write_hook,
    write_settings,
)
from ccm_guard.prevent.hookreport import Report
from ccm_guard.state.home import home, hooks_dir

LEGACY_SUFFIX = ".ccm-guard.legacy"


# --- where ccm-guard keeps a repository's hooks ----------------------------------------


def worktree_hooks_dir(common: Path, admin: Path) -> Path:
    return hooks_dir(common) / "worktrees" / admin.name


def worktree_dirs(worktree: Path) -> tuple[Path, Path]:
    """(admin dir, common dir) of a linked worktree, asked before any agent ran in it."""
    if not worktree.is_dir():
        raise RepoError(f"{worktree} is not a directory: create the task worktree first")
    try:
        found = git.discover(worktree)
    except NotARepository:
        raise RepoError(f"{worktree} is not in a git worktree: create the task worktree first") from None
    return found.git_dir, found.common_dir


# --- one task worktree -----------------------------------------------------------------


def install_worktree(worktree: Path, *, task: str, branch: str, role: str, log: Path,
                     base: str | None = None, allow_refs: Sequence[str] = ("refs/stash",),
                     trailers: Sequence[str] = (), check_paths: bool = True,
                     rules: dict[str, Any] | None = None, dirs: tuple[Path, Path] | None = None,
                     config: Sequence[tuple[str, str]] = ()) -> Report:
    """Guard one linked worktree with per-worktree hooks; idempotent.

    `base`: the commit whose policy pre-commit applies (default: the worktree's HEAD,
    which the agent can commit to). `allow_refs`: refs the task may update besides its
    branch (`refs/stash`: the shim allows `git stash`, and lint-staged keeps its
    backups there). `trailers`: `Key: value` lines commit-msg adds (none by default).
    `check_paths=False` leaves pre-commit chain-only, for roles without path rules:
    the policy check is most of what the hooks cost per commit. `dirs`: the worktree's
    (admin dir, common dir) where the caller made it and knows them (no git call to ask).
    `config`: more keys for the worktree's config.worktree, set with core.hooksPath (in a new
    worktree the file is written once, with no git process).
    """
    worktree = Path(os.path.realpath(worktree))
    admin, common = dirs or worktree_dirs(worktree)
    if admin == common:
        raise RepoError(f"{worktree} is the main checkout, not a task worktree: use `ccm-guard install` for the whole repository")
    branch = branch.removeprefix("refs/heads/")
    if not git.check_branch_name(branch):  # written into the hooks' settings: one line, a real name
        raise UsageError(f"{branch!r} is not a valid branch name: pass the task's branch, e.g. ccm/<task>")
    hooks = worktree_hooks_dir(common, admin)
    report = Report(target=worktree, hooks_dir=hooks)
    record = _worktree_record(hooks, admin / "config.worktree")
    enable_worktree_config(common, hooks_dir(common) / "worktree-config.json", report)
    hooks.mkdir(parents=True, exist_ok=True)
    settings = hooks / "settings"
    write_settings(settings, [
        ("version", "1"), ("task", task), ("branch", branch), ("role", role),
        ("log", str(Path(os.path.abspath(log)))), ("worktree", str(worktree)), ("admin", str(admin)),
        *((("base", base),) if base else ()),
        *(("allow_ref", ref) for ref in allow_refs), *(("trailer", t) for t in trailers),
        # The role's path rules compiled by exec, so pre-commit need not load the policy.
        *((("rules", json.dumps(rules, separators=(",", ":"))),) if rules is not None else ()),
    ])
    report.written.append(settings)
    prev = record["previous"] or repo_hooks_dir(common)
    checks = {"pre-commit": check_paths, "commit-msg": bool(trailers), "pre-push": True,
              "reference-transaction": True}
    write_chaining_dir(hooks, prev, worktree, settings=str(settings), tasks="", checks=checks, report=report)
    if "edit" not in record:
        record["edit"] = config_edit(admin / "config.worktree", "core.hooksPath", str(hooks), also=config)
        report.config.append(f"{admin / 'config.worktree'}: core.hooksPath = {hooks}")
    else:
        for key, value in config:
            git.config_file_set(admin / "config.worktree", key, value)
    (hooks / "install.json").write_text(json.dumps(record))
    return report


def install_worktree_here(worktree: Path, role: str | None) -> Report:
    """`ccm-guard install --worktree PATH`: guard a worktree someone made by hand, on the
    branch it has checked out, with the role's path rules as committed at its HEAD."""
    found = git.discover(worktree)
    repo = found.repo()
    branch = git.symbolic_head(repo)
    if branch is None or not branch.startswith("refs/heads/"):
        raise RepoError(f"{found.toplevel} has no branch checked out: check one out (git switch -c NAME) first")
    name = found.git_dir.name
    log = home() / "logs" / "installed" / f"{name}.refusals.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    return install_worktree(found.toplevel, task=name, branch=branch, role=role or "implementor", log=log,
                            base=git.resolve_commit(repo, "HEAD"))


def _worktree_record(hooks: Path, config_worktree: Path) -> dict[str, Any]:
    """What this worktree had before ccm-guard: from the earlier install if there was one."""
    current = config_get(config_worktree, "core.hooksPath")
    earlier = hooks / "install.json"
    if current == str(hooks) and earlier.is_file():
        return json.loads(earlier.read_text())  # type: ignore[no-any-return]
    return {"previous": current}


def uninstall_worktree(worktree: Path, *, restore_shared: bool = True,
                       dirs: tuple[Path, Path] | None = None) -> Report:
    """Undo install_worktree: config.worktree as it was, ccm-guard's hooks dir gone.

    `restore_shared=False` leaves extensions.worktreeConfig in the shared config: exec
    passes it, because another task running now would see that change as tampering.
    """
    worktree = Path(os.path.realpath(worktree))
    if not worktree.is_dir():
        raise RepoError(f"{worktree} is gone: uninstall before removing a worktree; its hooks dir "
                        f"under {home() / 'hooks'} can be deleted by hand")
    admin, common = dirs or worktree_dirs(worktree)
    hooks = worktree_hooks_dir(common, admin)
    report = Report(target=worktree, hooks_dir=hooks)
    config_worktree = admin / "config.worktree"
    record_file = hooks / "install.json"
    record = json.loads(record_file.read_text()) if record_file.is_file() else {}
    if "edit" in record:
        config_undo(record["edit"], record.get("previous"), report)
    elif config_get(config_worktree, "core.hooksPath") == str(hooks):
        git.config_file_set(config_worktree, "core.hooksPath", None)
        report.config.append(f"{config_worktree}: core.hooksPath unset (no install record)")
    if hooks.exists():
        report.removed += sorted(hooks.iterdir())
        shutil.rmtree(hooks)
    if restore_shared:
        disable_worktree_config(common, hooks_dir(common) / "worktree-config.json", report)
    _prune_state(common)
    return report


def _prune_state(common: Path) -> None:
    for directory in (hooks_dir(common) / "worktrees", hooks_dir(common)):
        try:
            directory.rmdir()
        except OSError:
            pass


# --- a whole repository ----------------------------------------------------------------


def install_repo(repo: Path, *, force: bool = False) -> Report:
    found = git.discover(repo)
    common = found.common_dir
    own = hooks_dir(common) / "repo"
    setting = hooks_path_setting([*user_config_files(common), common / "config.worktree"])
    manifest = _load_manifest(common)
    if setting and Path(found.toplevel, setting[0]) == own:
        return _install_hooks_path(found, own, manifest["previous"], manifest, setting[1])
    if setting and not force:
        value, where = setting
        raise RepoError(
            f"core.hooksPath is set to {value} in {where}, so git never runs {common / 'hooks'}: "
            f"unset it (git config --unset core.hooksPath), install per task worktree only "
            f"(ccm-guard install --worktree PATH), or pass --force to chain {value} from ccm-guard's own hooks dir"
        )
    if setting:
        return _install_hooks_path(found, own, setting[0], {}, setting[1])
    return _install_hooks_dir(found, manifest)


def _install_hooks_dir(found: git.Discovered, manifest: dict[str, Any]) -> Report:
    directory = found.common_dir / "hooks"
    report = Report(target=found.toplevel, hooks_dir=directory)
    moves = []
    for name in GUARD_HOOKS:
        hook, backup = directory / name, directory / (name + LEGACY_SUFFIX)
        if os.path.lexists(hook) and not is_ours(hook):
            if os.path.lexists(backup):
                raise RepoError(f"{backup} already exists and {hook} is not ccm-guard's: move one of them away, then install again")
            moves.append((hook, backup))
    created = manifest.get("created_dir", not directory.exists())
    directory.mkdir(parents=True, exist_ok=True)
    for hook, backup in moves:
        os.rename(hook, backup)  # the same inode: bytes, mode and times kept
        report.kept.append((hook, backup))
    tasks = str(hooks_dir(found.common_dir) / "worktrees")
    for name in GUARD_HOOKS:
        write_hook(directory / name, hook=name, tasks=tasks, legacy=str(directory / (name + LEGACY_SUFFIX)))
        report.written.append(directory / name)
    _save_manifest(found.common_dir, {"mode": "hooks-dir", "created_dir": created})
    return report


def _install_hooks_path(found: git.Discovered, own: Path, previous: str, manifest: dict[str, Any],
                        where: Path) -> Report:
    report = Report(target=found.toplevel, hooks_dir=own)
    tasks = str(hooks_dir(found.common_dir) / "worktrees")
    checks = dict.fromkeys(GUARD_HOOKS, True)
    write_chaining_dir(own, previous, found.toplevel, settings="", tasks=tasks, checks=checks, report=report)
    if "edit" not in manifest:
        # Local config beats global and system; a worktree-level setting is changed where it is.
        config = where if where.parent == found.common_dir else found.common_dir / "config"
        manifest = {"mode": "hooks-path", "previous": previous,
                    "previous_here": config_get(config, "core.hooksPath"),
                    "edit": config_edit(config, "core.hooksPath", str(own))}
        report.config.append(f"{config}: core.hooksPath = {own} (was {previous})")
    _save_manifest(found.common_dir, manifest)
    return report


def uninstall_repo(repo: Path) -> Report:
    found = git.discover(repo)
    manifest = _load_manifest(found.common_dir)
    if manifest.get("mode") == "hooks-path":
        report = Report(target=found.toplevel, hooks_dir=hooks_dir(found.common_dir) / "repo")
        config_undo(manifest["edit"], manifest.get("previous_here"), report)
        if report.hooks_dir and report.hooks_dir.exists():
            report.removed += sorted(report.hooks_dir.iterdir())
            shutil.rmtree(report.hooks_dir)
    else:
        report = _uninstall_hooks_dir(found.common_dir / "hooks", manifest.get("created_dir", False))
        report.target = found.toplevel
    (hooks_dir(found.common_dir) / "repo.json").unlink(missing_ok=True)
    _prune_state(found.common_dir)
    return report


def _uninstall_hooks_dir(directory: Path, created: bool) -> Report:
    report = Report(target=directory, hooks_dir=directory)
    for name in GUARD_HOOKS:
        hook, backup = directory / name, directory / (name + LEGACY_SUFFIX)
        if os.path.lexists(hook) and is_ours(hook):
            hook.unlink()
            report.removed.append(hook)
            if os.path.lexists(backup):
                os.rename(backup, hook)
                report.restored.append(hook)
        elif os.path.lexists(backup):
            report.notes.append(f"{hook} was replaced after install: left it and {backup.name} as they are")
    if created and directory.is_dir() and not any(directory.iterdir()):
        directory.rmdir()
        report.removed.append(directory)
    return report


def _load_manifest(common: Path) -> dict[str, Any]:
    path = hooks_dir(common) / "repo.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_manifest(common: Path, manifest: dict[str, Any]) -> None:
    path = hooks_dir(common) / "repo.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
