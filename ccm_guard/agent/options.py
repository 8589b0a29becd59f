"""What a person asked of one agent run: the options `exec` (and `task resume`) are given."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass
class ExecOptions:
    """What `exec` was asked to do, as parsed from its command line."""

    command: list[str]
    start: Path
    task: str | None = None
    base: str = "HEAD"
    timeout: float | None = None
    grace: float = 5.0
    role: str | None = None  # None: the policy's default role
    policy: Path | None = None  # --policy FILE, on top of the built-in, user and repository policies
    read_only: bool = False  # forces a read-only run whatever the role says
    require_commit: bool | None = None  # None: as the role says
    on_fail: str = "keep"  # or "discard"
    cleanup: bool = False
    keep_env: tuple[str, ...] = ()
    terminal: bool | None = None  # None: a pseudo-terminal when ccm-guard runs on one
    json_stdout: bool = False  # stdout carries the verdict: the agent's stdout goes to stderr
    sandbox: str = "auto"  # Landlock where the kernel has it; "landlock" (required) or "none"
    no_network: bool = False
    allow_ports: tuple[int, ...] = ()  # with no_network: TCP ports the agent may still connect to
    agent: str | None = None  # force an agent profile (codex, claude, ...); default: by the program run
    apply: bool = False  # on pass, apply the task into the branch the person has checked out
    snapshot_every: int | None = None  # a snapshot ref at every Nth commit (0: none); None: the role's
    link_dirs: bool = False  # .worktreeinclude: symlink matched directories instead of copying them
    pool: bool | None = None  # take the worktree from the warm pool: None, when the repository has one
    sparse: tuple[str, ...] = ()  # cone-mode sparse checkout of these directories (never pooled)
    setup: tuple[str, ...] | None = None  # commands before the agent (run/setup.py); None: the role's
    setup_timeout: float | None = None  # None: the role's setup_timeout
    check: str | None = None  # run after an agent whose run passed (a fork's test suite); its writes put back
    check_timeout: float = 600.0
    group: str | None = None  # the fork group this task belongs to (run/fork.py)
