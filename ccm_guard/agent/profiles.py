"""Agent profiles: which agent a command is, and what each one needs to work in a guarded
worktree (the state it keeps under $HOME, how to tell it about the task's other roots)."""

from __future__ import annotations

import os
from pathlib import Path

PROFILES = ("codex", "claude", "gemini", "aider", "generic")


# State a known agent keeps under $HOME, which it must be able to write inside the sandbox.
_PROFILE_HOME = {"claude": (".claude", ".claude.json"), "gemini": (".gemini",), "aider": ()}


def profile_of(command: list[str], forced: str | None) -> str:
    if forced:
        return forced
    name = Path(command[0]).name
    return name if name in PROFILES else "generic"


def home_state(profile: str) -> list[Path]:
    home = Path(os.path.expanduser("~"))
    return [home / name for name in _PROFILE_HOME.get(profile, ()) if (home / name).exists()]


def with_add_dirs(command: list[str], task_roots: list[Path]) -> list[str]:
    """Codex's own workspace-write sandbox knows nothing of linked worktrees: a commit
    needs the git metadata outside its cwd (docs/design-notes.md, the sandbox-blocked
    commit). Tell it the roots a commit needs besides the worktree."""
    extra = [arg for root in task_roots[1:] for arg in ("--add-dir", str(root))]
    at = 2 if len(command) > 1 and command[1] == "exec" else 1
    return [*command[:at], *extra, *command[at:]]


def codex_workspace_write(command: list[str]) -> bool:
    args = command[1:]
    if "--full-auto" in args:
        return True
    for i, arg in enumerate(args):
        if arg in ("-s", "--sandbox") and i + 1 < len(args) and args[i + 1] == "workspace-write":
            return True
        if arg == "--sandbox=workspace-write":
            return True
    return False
