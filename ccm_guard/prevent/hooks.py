"""Installing ccm-guard's git hooks: for one task worktree, or for a whole repository.

One sh template (hooks/hook.sh, package data) filled in the way pre-commit fills its
own: a marked block of shell-quoted values (the resolved interpreter, the hook name,
where the task settings are, which hook to chain), an id line that tells our files
from anyone else's (`HOOK_ID`, and `PRIOR_IDS` for earlier templates).

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

import base64
import dataclasses
import functools
import hashlib
import json
import os
import shlex
import shutil
import site
import sys
from pathlib import Path
from typing import Any, Iterable, Sequence

from ccm_guard import git
from ccm_guard.errors import NotARepository, RepoError, UsageError
from ccm_guard.prevent.resources import data_file
from ccm_guard.state.home import home, key_hash

GUARD_HOOKS = ("pre-commit", "commit-msg", "pre-push", "reference-transaction")
# Every hook name git runs (githooks(5)): the ones a chain-only script may stand in for.
GIT_HOOKS = frozenset((
    "applypatch-msg", "pre-applypatch", "post-applypatch", "pre-commit", "pre-merge-commit",
    "prepare-commit-msg", "commit-msg", "post-commit", "pre-rebase", "post-checkout",
    "post-merge", "pre-push", "pre-receive", "update", "proc-receive", "post-receive",
    "post-update", "reference-transaction", "push-to-checkout", "pre-auto-gc", "post-rewrite",
    "sendemail-validate", "fsmonitor-watchman", "p4-changelist", "p4-prepare-changelist",
    "p4-post-changelist", "p4-pre-submit", "post-index-change",
))
LEGACY_SUFFIX = ".ccm-guard.legacy"
ID_LINE = "# ccm-guard hook id: "
PRIOR_IDS: tuple[str, ...] = ()  # add the old id here whenever hook.sh's id changes
BLOCK_BEGIN = "# --- ccm-guard values: begin"
BLOCK_END = "# --- ccm-guard values: end"
TRUE = ("true", "yes", "on", "1")


@dataclasses.dataclass
class Report:
    """What install or uninstall did, for the CLI to render (text, or `to_json`)."""

    target: Path  # the worktree, or the repository's top level
    hooks_dir: Path | None = None  # where ccm-guard's hooks are (were)
    written: list[Path] = dataclasses.field(default_factory=list)  # ccm-guard's files
    kept: list[tuple[Path, Path]] = dataclasses.field(default_factory=list)  # (was, now), chained
    chained: list[str] = dataclasses.field(default_factory=list)  # hooks run first, left in place
    restored: list[Path] = dataclasses.field(default_factory=list)  # put back as they were
    removed: list[Path] = dataclasses.field(default_factory=list)  # ccm-guard's files removed
    config: list[str] = dataclasses.field(default_factory=list)  # "<file>: <change>"
    notes: list[str] = dataclasses.field(default_factory=list)  # what the person should check

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]


# --- the template ----------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def template() -> str:
    return data_file("hooks", "hook.sh").read_text(encoding="utf-8")


def hook_id(text: str) -> str | None:
    for line in text.splitlines()[:10]:
        if line.startswith(ID_LINE):
            return line[len(ID_LINE):].strip()
    return None


HOOK_ID = hook_id(template()) or ""


def is_ours(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(2048).decode("utf-8", "replace")
    except OSError:
        return False
    return hook_id(head) in (HOOK_ID, *PRIOR_IDS)


def render(values: dict[str, str]) -> str:
    lines = template().splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.startswith(BLOCK_BEGIN))
    end = next(i for i, line in enumerate(lines) if line.startswith(BLOCK_END))
    block = [f"{key}={shlex.quote(value)}\n" for key, value in values.items()]
    return "".join(lines[: begin + 1] + block + lines[end:])


def block_values(path: Path) -> dict[str, str]:
    """The values in one of our hook files' block (to chain through it, not to it)."""
    text = path.read_text(encoding="utf-8", errors="surrogateescape")
    values = {}
    inside = False
    for line in text.splitlines():
        if line.startswith(BLOCK_BEGIN) or line.startswith(BLOCK_END):
            inside = line.startswith(BLOCK_BEGIN)
        elif inside and "=" in line:
            key, _, value = line.partition("=")
            values[key] = "".join(shlex.split(value))
    return values


@functools.lru_cache(maxsize=1)
def interpreter() -> str:
    """The Python the hooks run. Never a pyenv shim (it adds ~80 ms to every hook);
    inside a virtual environment its own python, not the realpath (that would be the
    base interpreter, without the environment's packages)."""
    exe = sys.executable
    if not exe:
        raise UsageError("cannot tell which Python runs ccm-guard (sys.executable is empty): run it with a real interpreter")
    path = os.path.abspath(exe) if sys.prefix != sys.base_prefix else os.path.realpath(exe)
    with open(path, "rb") as f:
        if f.read(2) == b"#!":
            raise UsageError(f"{path} is a script (a pyenv shim?), not an interpreter: run ccm-guard with the real python")
    return path


@functools.lru_cache(maxsize=1)
def python_path() -> str:
    """Where the hooks' `python -I -S` finds ccm_guard and its dependencies (no site)."""
    import ccm_guard

    dirs = [str(Path(ccm_guard.__file__).resolve().parent.parent), *site.getsitepackages()]
    if site.ENABLE_USER_SITE and site.getusersitepackages():
        dirs.append(site.getusersitepackages())
    dirs = [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]
    bad = [d for d in dirs if ":" in d]
    if bad:
        raise UsageError(f"{bad[0]} contains ':', which the hooks use as a separator: install ccm-guard elsewhere")
    return ":".join(dirs)


def write_hook(path: Path, *, hook: str, settings: str = "", tasks: str = "", legacy: str = "",
               check: bool = True) -> None:
    text = render({"HOOK": hook, "PY": interpreter(), "PYPATH": python_path(), "SETTINGS": settings,
                   "TASKS": tasks, "LEGACY": legacy, "CHECK": "1" if check else "0"})
    _write_atomic(path, text.encode(), 0o755)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.ccm-guard-tmp")
    tmp.write_bytes(data)
    tmp.chmod(mode)
    os.replace(tmp, path)


# --- config files ---------------------------------------------------------------------------


def worktree_dirs(worktree: Path) -> tuple[Path, Path]:
    """(admin dir, common dir) of a linked worktree, asked before any agent ran in it."""
    if not worktree.is_dir():
        raise RepoError(f"{worktree} is not a directory: create the task worktree first")
    try:
        found = git.discover(worktree)
    except NotARepository:
        raise RepoError(f"{worktree} is not in a git worktree: create the task worktree first") from None
    return found.git_dir, found.common_dir


def config_get(path: Path, key: str) -> str | None:
    if not path.is_file():
        return None
    values = [v for k, v in git.config_entries(path) if k == key.lower()]
    return values[-1] if values else None


def config_edit(path: Path, key: str, value: str | None) -> dict[str, Any]:
    """Change one key and return what undoing it byte for byte needs."""
    before = path.read_bytes() if path.exists() else None
    mode = path.stat().st_mode & 0o7777 if before is not None else 0o644
    git.config_file_set(path, key, value)
    return {"path": str(path), "key": key, "value": value, "mode": mode, "after": _sha(path),
            "before": None if before is None else base64.b64encode(before).decode()}


def config_undo(edit: dict[str, Any], value: str | None, report: Report) -> None:
    """Put a config file back as it was; if it changed since, only the key (and say so)."""
    path = Path(edit["path"])
    if _sha(path) == edit["after"]:
        if edit["before"] is None:
            path.unlink(missing_ok=True)
        else:
            _write_atomic(path, base64.b64decode(edit["before"]), edit["mode"])
        report.restored.append(path)
        return
    if config_get(path, edit["key"]) != edit["value"]:
        report.notes.append(f"{path}: {edit['key']} was changed since install: left as it is")
        return
    git.config_file_set(path, edit["key"], value)
    report.config.append(f"{path}: {edit['key']} {'unset' if value is None else 'set to ' + value}")
    report.notes.append(f"{path} changed since install: only {edit['key']} was put back")


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


def user_config_files(common: Path) -> list[Path]:
    """The config files git reads for a repository, lowest precedence first."""
    files = [] if os.environ.get("GIT_CONFIG_NOSYSTEM") else [Path("/etc/gitconfig")]
    if os.environ.get("GIT_CONFIG_GLOBAL"):
        files.append(Path(os.environ["GIT_CONFIG_GLOBAL"]))
    else:
        files += git.global_config_files()
    return [*files, common / "config"]


def hooks_path_setting(files: Iterable[Path]) -> tuple[str, Path] | None:
    """The effective core.hooksPath and the file that sets it (includes not followed)."""
    found = None
    for path in files:
        value = config_get(path, "core.hooksPath")
        if value is not None:
            found = (os.path.expanduser(value) if value.startswith("~/") else value, path)
    return found


# --- where ccm-guard keeps a repository's hooks ----------------------------------------


def state_dir(common: Path) -> Path:
    name = common.parent.name if common.name == ".git" else common.name
    return home() / "hooks" / f"{name}-{key_hash(common)}"


def worktree_hooks_dir(common: Path, admin: Path) -> Path:
    return state_dir(common) / "worktrees" / admin.name


def _chain_target(prev: str, base: Path, name: str) -> str:
    """The hook to chain for `name` from hooks dir `prev` (relative to `base` if relative):
    through one of our own files to what it chains, so nothing runs twice."""
    candidate = Path(base, prev, name)
    if candidate.is_file() and is_ours(candidate):
        return block_values(candidate).get("LEGACY", "")
    return os.path.join(prev, name)


def _present_hooks(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir()
                  if p.name in GIT_HOOKS and p.is_file() and os.access(p, os.X_OK))


def _write_chaining_dir(directory: Path, prev: str, base: Path, *, settings: str, tasks: str,
                        checks: dict[str, bool], report: Report) -> None:
    """Our hooks in `directory`, each chaining hooks dir `prev` by path; a chain-only
    script for any other hook `prev` holds."""
    directory.mkdir(parents=True, exist_ok=True)
    names = sorted({*GUARD_HOOKS, *_present_hooks(Path(base, prev))})
    for stale in directory.iterdir():  # an earlier install's chain-only scripts
        if stale.name in GIT_HOOKS and stale.name not in names and is_ours(stale):
            stale.unlink()
    for name in names:
        legacy = _chain_target(prev, base, name)
        write_hook(directory / name, hook=name, settings=settings, tasks=tasks, legacy=legacy,
                   check=checks.get(name, False))
        report.written.append(directory / name)
        if Path(base, legacy).is_file():
            report.chained.append(legacy)


# --- one task worktree -----------------------------------------------------------------


def write_settings(path: Path, values: Sequence[tuple[str, str]]) -> None:
    """The task settings file the hooks read, one `key=value` a line (keys may repeat):

        version=1
        task=<task id>
        branch=<the task's branch, short: ccm/<task>>
        role=<role name>
        log=<absolute path of the JSON-lines refusal log>
        worktree=<absolute path of the worktree>
        admin=<absolute path of its admin dir>
        base=<commit whose policy pre-commit applies>                           (0..1)
        allow_ref=<a ref, or a prefix ending in '/', the task may also update>   (0..n)
        trailer=<Key: value, added to each commit message by commit-msg>        (0..n)
    """
    for key, value in values:
        if "\n" in value or "\r" in value:
            raise UsageError(f"{key} {value!r} contains a line break: choose a name without one")
    text = "# ccm-guard task settings: written by `ccm-guard install`, read by the task's hooks\n"
    _write_atomic(path, (text + "".join(f"{k}={v}\n" for k, v in values)).encode(), 0o644)


def install_worktree(worktree: Path, *, task: str, branch: str, role: str, log: Path,
                     base: str | None = None, allow_refs: Sequence[str] = ("refs/stash",),
                     trailers: Sequence[str] = (), check_paths: bool = True,
                     rules: dict[str, Any] | None = None) -> Report:
    """Guard one linked worktree with per-worktree hooks; idempotent.

    `base`: the commit whose policy pre-commit applies (default: the worktree's HEAD,
    which the agent can commit to). `allow_refs`: refs the task may update besides its
    branch (`refs/stash`: the shim allows `git stash`, and lint-staged keeps its
    backups there). `trailers`: `Key: value` lines commit-msg adds (none by default).
    `check_paths=False` leaves pre-commit chain-only, for roles without path rules:
    the policy check is most of what the hooks cost per commit.
    """
    worktree = Path(os.path.realpath(worktree))
    admin, common = worktree_dirs(worktree)
    if admin == common:
        raise RepoError(f"{worktree} is the main checkout, not a task worktree: use `ccm-guard install` for the whole repository")
    branch = branch.removeprefix("refs/heads/")
    if not git.check_branch_name(branch):
        raise UsageError(f"{branch!r} is not a valid branch name: pass the task's branch, e.g. ccm/<task>")
    hooks = worktree_hooks_dir(common, admin)
    report = Report(target=worktree, hooks_dir=hooks)
    record = _worktree_record(hooks, admin / "config.worktree")
    _enable_worktree_config(common, report)
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
    prev = record["previous"] or _repo_hooks_dir(common)
    checks = {"pre-commit": check_paths, "commit-msg": bool(trailers), "pre-push": True,
              "reference-transaction": True}
    _write_chaining_dir(hooks, prev, worktree, settings=str(settings), tasks="", checks=checks, report=report)
    if "edit" not in record:
        record["edit"] = config_edit(admin / "config.worktree", "core.hooksPath", str(hooks))
        report.config.append(f"{admin / 'config.worktree'}: core.hooksPath = {hooks}")
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


def _repo_hooks_dir(common: Path) -> str:
    setting = hooks_path_setting(user_config_files(common))
    return setting[0] if setting else str(common / "hooks")


def _enable_worktree_config(common: Path, report: Report) -> None:
    config = common / "config"
    if (config_get(config, "extensions.worktreeConfig") or "").lower() in TRUE:
        return
    # With worktreeConfig on, git applies these from the shared config to every worktree
    # (git-worktree(1) says to move them to the main worktree's config.worktree first).
    for key in ("core.worktree", "core.bare"):
        value = config_get(config, key)
        if value is not None and (key == "core.worktree" or value.lower() in TRUE):
            raise RepoError(f"{config} sets {key}, which would apply to every worktree once "
                            f"extensions.worktreeConfig is on: move it to {common / 'config.worktree'} first")
    marker = state_dir(common) / "worktree-config.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(config_edit(config, "extensions.worktreeConfig", "true")))
    report.config.append(f"{config}: extensions.worktreeConfig = true")


def uninstall_worktree(worktree: Path, *, restore_shared: bool = True) -> Report:
    """Undo install_worktree: config.worktree as it was, ccm-guard's hooks dir gone.

    `restore_shared=False` leaves extensions.worktreeConfig in the shared config: exec
    passes it, because another task running now would see that change as tampering.
    """
    worktree = Path(os.path.realpath(worktree))
    if not worktree.is_dir():
        raise RepoError(f"{worktree} is gone: uninstall before removing a worktree; its hooks dir "
                        f"under {home() / 'hooks'} can be deleted by hand")
    admin, common = worktree_dirs(worktree)
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
        _disable_worktree_config(common, report)
    _prune_state(common)
    return report


def _disable_worktree_config(common: Path, report: Report) -> None:
    """Undo extensions.worktreeConfig if ccm-guard set it and no worktree config is left
    (another task's, or one the person made since, still needs it)."""
    marker = state_dir(common) / "worktree-config.json"
    if not marker.is_file():
        return
    left = [p for p in [common / "config.worktree", *common.glob("worktrees/*/config.worktree")] if p.exists()]
    if left:
        return
    config_undo(json.loads(marker.read_text()), None, report)
    marker.unlink()


def _prune_state(common: Path) -> None:
    for directory in (state_dir(common) / "worktrees", state_dir(common)):
        try:
            directory.rmdir()
        except OSError:
            pass


# --- a whole repository ----------------------------------------------------------------


def install_repo(repo: Path, *, force: bool = False) -> Report:
    found = git.discover(repo)
    common = found.common_dir
    own = state_dir(common) / "repo"
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
    tasks = str(state_dir(found.common_dir) / "worktrees")
    for name in GUARD_HOOKS:
        write_hook(directory / name, hook=name, tasks=tasks, legacy=str(directory / (name + LEGACY_SUFFIX)))
        report.written.append(directory / name)
    _save_manifest(found.common_dir, {"mode": "hooks-dir", "created_dir": created})
    return report


def _install_hooks_path(found: git.Discovered, own: Path, previous: str, manifest: dict[str, Any],
                        where: Path) -> Report:
    report = Report(target=found.toplevel, hooks_dir=own)
    tasks = str(state_dir(found.common_dir) / "worktrees")
    checks = dict.fromkeys(GUARD_HOOKS, True)
    _write_chaining_dir(own, previous, found.toplevel, settings="", tasks=tasks, checks=checks, report=report)
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
        report = Report(target=found.toplevel, hooks_dir=state_dir(found.common_dir) / "repo")
        config_undo(manifest["edit"], manifest.get("previous_here"), report)
        if report.hooks_dir and report.hooks_dir.exists():
            report.removed += sorted(report.hooks_dir.iterdir())
            shutil.rmtree(report.hooks_dir)
    else:
        report = _uninstall_hooks_dir(found.common_dir / "hooks", manifest.get("created_dir", False))
        report.target = found.toplevel
    (state_dir(found.common_dir) / "repo.json").unlink(missing_ok=True)
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
    path = state_dir(common) / "repo.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _save_manifest(common: Path, manifest: dict[str, Any]) -> None:
    path = state_dir(common) / "repo.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
