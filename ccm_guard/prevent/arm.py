"""Arming a task before its agent starts: the git shim, the guard hooks, the OS sandbox,
and what each known agent needs to work inside them.

All of it is prevention: helpful, never trusted. An agent can run the real git by path
or edit files when it is not sandboxed; the snapshots and gates after the run decide.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from ccm_guard import git
from ccm_guard.agent.profiles import (
    PROFILES,
    codex_workspace_write,
    home_state,
    profile_of,
    with_add_dirs,
)
from ccm_guard.errors import UsageError
from ccm_guard.policy import Role
from ccm_guard.prevent import hooks as install
from ccm_guard.prevent import roots, sandbox
from ccm_guard.prevent.resources import data_file
from ccm_guard.state.home import admin_lock
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Task

SANDBOXES = ("none", "landlock", "auto")


@dataclasses.dataclass
class Armed:
    command: list[str]  # the agent's command, with what its profile adds
    env: dict[str, str]
    confine: Callable[[], None] | None  # the Landlock ruleset's enforce, run in the child
    sandbox: str  # what ran: "none", "landlock ABI 7", ...
    profile: str
    refusal_log: Path
    writable: list[Path]  # what the agent may write under the sandbox


def check_options(sandbox_mode: str, no_network: bool, agent: str | None) -> None:
    """Refuse impossible options before anything is created."""
    if sandbox_mode not in SANDBOXES:
        raise UsageError(f"unknown sandbox {sandbox_mode!r}: choose one of {', '.join(SANDBOXES)}")
    if no_network and sandbox_mode == "none":
        raise UsageError("--no-network needs the sandbox: add --sandbox landlock (or auto)")
    if sandbox_mode == "landlock" and sandbox.abi() == 0:
        raise UsageError("Landlock is not available on this kernel: run with --sandbox auto or none")
    if no_network and 0 < sandbox.abi() < 4:
        raise UsageError(f"--no-network needs Landlock ABI 4 or newer; this kernel has {sandbox.abi()}")
    if agent is not None and agent not in PROFILES:
        raise UsageError(f"unknown agent profile {agent!r}: choose one of {', '.join(PROFILES)}")


def arm(task: Task, pins: Pins, role: Role, command: list[str], *, sandbox_mode: str, no_network: bool,
        agent: str | None, rules: dict[str, Any] | None = None) -> Armed:
    """`rules`: the role's path rules compiled ahead, for the pre-commit hook."""
    log_dir = Path(task.log_dir)
    private = log_dir / "agent"  # the agent's own writable corner: temp files, the refusal log
    (private / "tmp").mkdir(parents=True, exist_ok=True)
    refusal_log = private / "refusals.jsonl"
    shim_dir = _install_shim(log_dir / "bin")
    with admin_lock(pins.common_dir):
        install.install_worktree(pins.worktree, task=task.id, branch=task.branch, role=role.name, log=refusal_log,
                                 base=task.base, check_paths=role.allow is not None or bool(role.forbid),
                                 rules=rules)
    profile = profile_of(command, agent)
    env = {
        "PATH": f"{shim_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "CCM_GUARD_REAL_GIT": git.binary(), "CCM_GUARD_BRANCH": task.branch, "CCM_GUARD_LOG": str(refusal_log),
        "CCM_GUARD_ALLOW": " ".join(role.git_allow), "TMPDIR": str(private / "tmp"),
        # git's messages in English, so the blocked-commit signature can be recognised.
        "LC_MESSAGES": "C",
    }
    confine, described, writable = landlock(sandbox_mode, no_network, lambda: roots.writable_roots(pins.worktree),
                                            private, profile)
    if profile == "codex" and codex_workspace_write(command):
        command = with_add_dirs(command, writable or roots.writable_roots(pins.worktree))
    return Armed(command, env, confine, described, profile, refusal_log, writable)


def _install_shim(directory: Path) -> Path:
    """A copy of the shim for this task, executable, first on the agent's PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_file("shims", "git"), directory / "git")
    (directory / "git").chmod(0o755)
    return directory


def landlock(sandbox_mode: str, no_network: bool, task_roots: Callable[[], list[Path]], private: Path,
             profile: str) -> tuple[Callable[[], None] | None, str, list[Path]]:
    """The run's Landlock ruleset, for either strategy: its task roots (asked only when the
    sandbox is on), its private directory and the state its agent keeps in $HOME writable.
    Returns the enforce to run in the child (None when unconfined), what ran, and the
    writable paths ([] when unconfined)."""
    if sandbox_mode == "none":
        return None, "none", []
    if sandbox.abi() == 0:
        return None, "none (Landlock is not available on this kernel)", []
    writable = [*task_roots(), private, *home_state(profile)]
    confine = sandbox.prepare(writable, no_network=no_network).enforce
    return confine, sandbox.describe() + (" without network" if no_network else ""), writable


def refusals(log: Path) -> list[dict[str, object]]:
    """What the shim and the hooks refused during the run (one JSON object a line)."""
    found = []
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            item = {"unreadable": line[:200]}  # the agent can write this file: report, don't trust
        found.append(item if isinstance(item, dict) else {"unreadable": line[:200]})
    return found


def disarm(pins: Pins) -> None:
    """Remove the task's hooks before its worktree goes; the shared setting stays (other
    tasks, running now, rely on extensions.worktreeConfig)."""
    with admin_lock(pins.common_dir):
        install.uninstall_worktree(pins.worktree, restore_shared=False)
