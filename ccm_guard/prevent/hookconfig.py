"""The git config the guard hooks' install changes, and putting it back byte for byte.

Install sets `core.hooksPath` (in a task worktree's `config.worktree`, or in the
repository's config) and, for per-worktree hooks, `extensions.worktreeConfig` in the
shared config. Each edit keeps the file's bytes and mode from before, so that uninstall
restores exactly that file, or, when someone changed it since, only the one key.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any, Iterable, Sequence

from ccm_guard import git
from ccm_guard.digest import sha256_hex
from ccm_guard.errors import RepoError
from ccm_guard.files import replace_file
from ccm_guard.git import config as configfile
from ccm_guard.prevent.hookreport import Report

TRUE = ("true", "yes", "on", "1")


def config_get(path: Path, key: str) -> str | None:
    if not path.is_file():
        return None
    try:
        with open(path, "rb") as fh:
            head: bytes | None = fh.read(configfile.READ_LIMIT + 1)
    except OSError:
        head = None  # unreadable: git says why
    if head is not None and len(head) <= configfile.READ_LIMIT and not git.may_set(head, key):
        return None
    values = [v for k, v in configfile.file_entries(path, head) if k == key.lower()]
    return values[-1] if values else None


def config_edit(path: Path, key: str, value: str | None, also: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Change one key and return what undoing it byte for byte needs. `also`: more keys set
    with it, which the undo takes out with the file (or leaves, where the file changed since)."""
    before = path.read_bytes() if path.exists() else None
    mode = path.stat().st_mode & 0o7777 if before is not None else 0o644
    # A new file is written whole, without a git process; an existing one is git's to edit.
    if before is not None or value is None or not git.config_file_create(path, [(key, value), *also]):
        for name, setting in ((key, value), *also):
            git.config_file_set(path, name, setting)
    return {"path": str(path), "key": key, "value": value, "mode": mode, "after": _sha(path),
            "before": None if before is None else base64.b64encode(before).decode()}


def config_undo(edit: dict[str, Any], value: str | None, report: Report) -> None:
    """Put a config file back as it was; if it changed since, only the key (and say so)."""
    path = Path(edit["path"])
    if _sha(path) == edit["after"]:
        if edit["before"] is None:
            path.unlink(missing_ok=True)
        else:
            replace_file(path, base64.b64decode(edit["before"]), edit["mode"])
        report.restored.append(path)
        return
    if config_get(path, edit["key"]) != edit["value"]:
        report.notes.append(f"{path}: {edit['key']} was changed since install: left as it is")
        return
    git.config_file_set(path, edit["key"], value)
    report.config.append(f"{path}: {edit['key']} {'unset' if value is None else 'set to ' + value}")
    report.notes.append(f"{path} changed since install: only {edit['key']} was put back")


def _sha(path: Path) -> str | None:
    return sha256_hex(path.read_bytes()) if path.exists() else None


# --- core.hooksPath ----------------------------------------------------------------------


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


def repo_hooks_dir(common: Path) -> str:
    """The hooks dir git runs for the repository: its core.hooksPath, else `<common>/hooks`."""
    setting = hooks_path_setting(user_config_files(common))
    return setting[0] if setting else str(common / "hooks")


# --- extensions.worktreeConfig ---------------------------------------------------------------


def enable_worktree_config(common: Path, marker: Path, report: Report) -> None:
    """Turn extensions.worktreeConfig on unless it is; `marker` records that ccm-guard did."""
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
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps(config_edit(config, "extensions.worktreeConfig", "true")))
    report.config.append(f"{config}: extensions.worktreeConfig = true")


def disable_worktree_config(common: Path, marker: Path, report: Report) -> None:
    """Undo extensions.worktreeConfig if ccm-guard set it (`marker`) and no worktree config
    is left (another task's, or one the person made since, still needs it)."""
    if not marker.is_file():
        return
    left = [p for p in [common / "config.worktree", *common.glob("worktrees/*/config.worktree")] if p.exists()]
    if left:
        return
    config_undo(json.loads(marker.read_text()), None, report)
    marker.unlink()
