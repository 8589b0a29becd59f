"""Arming a task before its agent starts: the git shim, the guard hooks, the OS sandbox,
and what each known agent needs to work inside them.

All of it is prevention: helpful, never trusted. An agent can run the real git by path
or edit files when it is not sandboxed; the snapshots and gates after the run decide.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

from ccm_guard import git
from ccm_guard.agent import homes
from ccm_guard.agent.profiles import (
    PROFILES,
    Launch,
    codex_workspace_write,
    launch_of,
    model_ports,
    with_add_dirs,
    without_own_sandbox,
)
from ccm_guard.errors import StateError, UsageError
from ccm_guard.files import read_regular
from ccm_guard.git import config as configfile
from ccm_guard.policy import Role
from ccm_guard.prevent import hookfiles, roots, sandbox
from ccm_guard.prevent import hooks as install
from ccm_guard.prevent.resources import data_file
from ccm_guard.state import home as state_home
from ccm_guard.state.home import admin_lock
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Task
from ccm_guard.text import first_few

SANDBOXES = ("auto", "landlock", "none")


@dataclasses.dataclass
class Agent:
    """Which agent runs, with what its profile adds, and its task-private home."""

    launch: Launch
    command: list[str]
    home: homes.Home | None
    home_before: dict[str, bytes]  # the home's watched files after seeding, for agent-home

    @property
    def profile(self) -> str:
        return self.launch.profile

    @property
    def env(self) -> dict[str, str]:
        """The variables that point the agent at its private home."""
        return dict(self.home.env) if self.home else {}

    def ports(self) -> tuple[int, ...]:
        """The ports its model needs, for --no-network."""
        return model_ports(self.profile, os.environ, self.command[self.launch.head:],
                           self.home.path if self.home else None)


@dataclasses.dataclass
class Armed:
    """What the agent is started with: its command, environment, sandbox and guards."""

    command: list[str]  # the agent's command, with what its profile adds
    env: dict[str, str]
    confine: Callable[[], None] | None  # the Landlock ruleset's enforce, run in the child
    sandbox: str  # what ran: "landlock ABI 7", "none (...)", ...
    agent: Agent
    refusal_log: Path
    git_log: Path  # git's trace2 events from the agent's git processes
    writable: list[Path]  # what the agent may write under the sandbox
    notes: tuple[str, ...] = ()  # for the verdict (no git identity, ...)
    identity: str | None = None  # "Name <email>": who the agent's commits are by

    @property
    def profile(self) -> str:
        return self.agent.profile


def confines(sandbox_mode: str) -> bool:
    """Whether a run with this --sandbox is confined by Landlock."""
    return sandbox_mode != "none" and sandbox.abi() > 0


def check_options(sandbox_mode: str, no_network: bool, agent: str | None) -> None:
    """Refuse impossible options before anything is created."""
    if sandbox_mode not in SANDBOXES:
        raise UsageError(f"unknown sandbox {sandbox_mode!r}: choose one of {', '.join(SANDBOXES)}")
    if no_network and sandbox_mode == "none":
        raise UsageError("--no-network needs the sandbox: drop --sandbox none")
    if (sandbox_mode == "landlock" or no_network) and sandbox.abi() == 0:
        raise UsageError(f"{'--no-network' if no_network else '--sandbox landlock'} needs Landlock, which this "
                         "kernel does not have: drop it (the default, --sandbox auto, runs unsandboxed here)")
    if no_network and 0 < sandbox.abi() < 4:
        raise UsageError(f"--no-network needs Landlock ABI 4 or newer; this kernel has {sandbox.abi()}")
    if agent is not None and agent not in PROFILES:
        raise UsageError(f"unknown agent profile {agent!r}: choose one of {', '.join(PROFILES)}")


def prepare_agent(command: list[str], forced: str | None, private: Path, *, main: Path, worktree: Path) -> Agent:
    """The agent's profile and its private home (agent.homes), for either strategy."""
    launch = launch_of(command, forced)
    home = homes.prepare(launch.profile, private, main=main, worktree=worktree, environ=os.environ,
                         launcher=command[:launch.head], templates=state_home.home() / "agent-templates")
    return Agent(launch=launch, command=_with_profile_arguments(launch, command, private), home=home,
                 home_before=home.read_watched() if home else {})


def _with_profile_arguments(launch: Launch, command: list[str], private: Path) -> list[str]:
    """aider: commit with the hooks, leave .gitignore alone, and keep its history files out
    of the worktree (clean-tree would fail on them). An option the person gave wins."""
    if launch.profile != "aider":
        return command
    given = set(arg.split("=", 1)[0] for arg in command[launch.head:])
    wanted = [("--git-commit-verify", None), ("--no-gitignore", None),
              ("--input-history-file", private / "aider.input.history"),
              ("--chat-history-file", private / "aider.chat.history.md")]
    negations = {"--git-commit-verify": "--no-git-commit-verify", "--no-gitignore": "--gitignore"}
    extra: list[str] = []
    for option, value in wanted:
        if option in given or negations.get(option) in given:
            continue
        extra += [option] if value is None else [option, str(value)]
    return [*command[:launch.head], *extra, *command[launch.head:]]


def arm(task: Task, pins: Pins, role: Role, command: list[str], *, sandbox_mode: str, no_network: bool,
        agent: str | None, allow_ports: tuple[int, ...] = (), rules: dict[str, Any] | None = None) -> Armed:
    """`rules`: the role's path rules compiled ahead, for the pre-commit hook."""
    log_dir = Path(task.log_dir)
    private = log_dir / "agent"  # the agent's own writable corner: temp files, its home, the refusal log
    (private / "tmp").mkdir(parents=True, exist_ok=True)
    refusal_log = private / "refusals.jsonl"
    # git's own trace2 events, from every git the agent runs (through the shim, by path, from
    # a login shell that reset PATH): its errors are what recovery reads when the agent's CLI
    # keeps git's stderr to itself. Under TMPDIR: an agent with a sandbox of its own (codex)
    # still lets its commands write there.
    git_log = private / "tmp" / "ccm-guard-git-trace2.jsonl"
    with contextlib.suppress(FileNotFoundError):
        git_log.unlink()  # a resumed task's earlier run is not this run
    shim_dir = _install_shim(log_dir / "bin")
    who = prepare_agent(command, agent, private, main=Path(task.main_worktree), worktree=pins.worktree)
    with admin_lock(pins.common_dir):
        config, identity, notes = _worktree_config(pins, main=Path(task.main_worktree), profile=who.profile)
        install.install_worktree(pins.worktree, task=task.id, branch=task.branch, role=role.name, log=refusal_log,
                                 base=task.base, check_paths=role.allow is not None or bool(role.forbid),
                                 rules=rules, dirs=(pins.admin_dir, pins.common_dir), config=config)
    env = {
        "PATH": f"{shim_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
        "CCM_GUARD_REAL_GIT": git.binary(), "CCM_GUARD_BRANCH": task.branch, "CCM_GUARD_LOG": str(refusal_log),
        "CCM_GUARD_ALLOW": " ".join(role.git_allow), "TMPDIR": str(private / "tmp"),
        "GIT_TRACE2_EVENT": str(git_log), "GIT_TRACE2_EVENT_BRIEF": "true",
        # git's messages in English, so the blocked-commit signature can be recognised.
        "LC_MESSAGES": "C",
        **who.env,
    }
    confine, described, writable = landlock(sandbox_mode, no_network, lambda: roots.writable_roots(pins.worktree),
                                            private, ports=(*allow_ports, *who.ports()) if no_network else ())
    if confine is not None:
        env.update(sandboxed_caches(private))
        # refs/stash is shared and read-only here: the shim keeps the worktree's own stash.
        env.update(CCM_GUARD_STASH_PY=hookfiles.interpreter(), CCM_GUARD_STASH_PATH=hookfiles.python_path())
    command, said = with_own_sandbox(who, sandboxed=confine is not None, described=described,
                                     task_roots=lambda: roots.writable_roots(pins.worktree))
    return Armed(command, env, confine, described, who, refusal_log, git_log, writable,
                 (*notes, *said, *socket_notes(sandboxed=confine is not None)), identity)


def socket_notes(*, sandboxed: bool) -> tuple[str, ...]:
    """What the sandbox cannot close, said once: the Unix sockets of the person's own
    servers on the file system (abstract ones are closed from ABI 6; the variables that
    name sockets are scrubbed from the agent's environment, but their paths are known)."""
    found = sandbox.reachable_sockets() if sandboxed else []
    if not found:
        return ()
    return (f"the sandbox cannot refuse connections to Unix sockets on the file system, and the agent could "
            f"reach {first_few(found)}: a tmux, D-Bus or docker server there runs commands outside the "
            "sandbox (stop it while agents run, or run ccm-guard in a container)",)


def with_own_sandbox(who: Agent, *, sandboxed: bool, described: str,
                     task_roots: Callable[[], list[Path]]) -> tuple[list[str], tuple[str, ...]]:
    """The agent's command for an agent with a sandbox of its own (codex's workspace-write),
    for either strategy: outside ccm-guard's sandbox it is told the task's other roots;
    inside, ccm-guard's sandbox takes its place. Returns the command and a note."""
    head = who.launch.head
    if who.profile != "codex" or not codex_workspace_write(who.command[head:], who.home.path if who.home else None):
        return who.command, ()
    if not sandboxed:
        return with_add_dirs(who.command, head, task_roots()), ()
    return without_own_sandbox(who.command, head), (
        f"codex's own workspace-write sandbox cannot run inside ccm-guard's (its bubblewrap needs to write "
        f"/proc/self/uid_map): ccm-guard's sandbox ({described}) confines its commands instead; their network "
        "is open unless you pass --no-network",)


WORKTREE_KEYS = ("user.name", "user.email", "core.excludesFile")
EXCLUDES = "ccm-guard-excludes"


def _task_config(pins: Pins) -> Path:
    """The task's config.worktree, which ccm-guard edits: refused when it is not a regular
    file (git would write through a link the agent planted, to a file of the person's)."""
    path = pins.admin_dir / "config.worktree"
    if _planted(path):
        raise StateError(f"{path} is not a regular file: the task's git metadata was tampered with; "
                         f"discard the task (ccm-guard task discard)")
    return path


def _planted(path: Path) -> bool:
    """Something other than a regular file where git keeps one: a link, a FIFO, a directory."""
    return path.is_symlink() or (os.path.lexists(path) and not path.is_file())


def _worktree_config(pins: Pins, *, main: Path, profile: str
                     ) -> tuple[list[tuple[str, str]], str | None, tuple[str, ...]]:
    """The keys for the task's own config (config.worktree, read before any global file by
    the agent's git; install writes them with core.hooksPath): the person's identity as
    their git sees it in their checkout, so the agent's commits are theirs even where
    identity came from the environment or an includeIf on the checkout's path (aider,
    finding none, would write "Your Name" into the shared config); and, for aider, an
    ignore file (written here) that adds its tags cache to the person's own global
    ignores. Returns the keys, who the commits are by ("Name <email>", None when nobody),
    and notes for the verdict. Called under the admin lock."""
    settings: list[tuple[str, str]] = []  # only WORKTREE_KEYS: disarm takes them out again
    identity = configfile.person_identity(main)
    notes: tuple[str, ...] = ()
    if {"GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL"} <= set(identity):
        settings += [("user.name", identity["GIT_AUTHOR_NAME"]), ("user.email", identity["GIT_AUTHOR_EMAIL"])]
    else:
        notes = ("git has no identity for commits here (user.name/user.email unset, no GIT_AUTHOR_NAME/EMAIL): "
                 "the agent's commits fail with 'Author identity unknown' unless git can guess one; set them with "
                 "git config --global user.name 'Your Name' and git config --global user.email you@example.com",)
    _task_config(pins)  # refused if planted: git would write through it
    if profile == "aider":
        # In the task's admin dir: git metadata, so the snapshots judge any change to it.
        excludes = pins.admin_dir / EXCLUDES
        try:
            person = configfile.person_excludes(main).read_bytes()
        except OSError:
            person = b""
        excludes.write_bytes(person + b"\n# aider's repository map cache (ccm-guard)\n/.aider.tags.cache.v4/\n")
        settings.append(("core.excludesFile", str(excludes)))
    who = f"{identity['GIT_AUTHOR_NAME']} <{identity['GIT_AUTHOR_EMAIL']}>" if not notes else None
    return settings, who, notes


def _install_shim(directory: Path) -> Path:
    """A copy of the shim for this task, executable, first on the agent's PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data_file("shims", "git"), directory / "git")
    (directory / "git").chmod(0o755)
    return directory


def sandboxed_caches(private: Path) -> dict[str, str]:
    """Under the sandbox $HOME is read-only, so the caches tools keep there (pip, go, npm,
    and whatever follows XDG) move to the task's private directory: cold, but writable."""
    cache = private / "cache"
    cache.mkdir(exist_ok=True)
    return {"XDG_CACHE_HOME": str(cache), "npm_config_cache": str(cache / "npm")}


def landlock(sandbox_mode: str, no_network: bool, task_roots: Callable[[], list[Path]], private: Path, *,
             ports: tuple[int, ...] = ()) -> tuple[Callable[[], None] | None, str, list[Path]]:
    """The run's Landlock ruleset, for either strategy: its task roots (asked only when the
    sandbox is on) and its private directory (temp files, the agent's home) writable; with
    `no_network`, TCP only to `ports`. Returns the enforce to run in the child (None when
    unconfined), what ran, and the writable paths ([] when unconfined)."""
    if not confines(sandbox_mode):
        return None, ("none (--sandbox none)" if sandbox_mode == "none" else
                      "none: this kernel has no Landlock, so the agent ran unsandboxed"), []
    writable = [*task_roots(), private]
    confine = sandbox.prepare(writable, no_network=no_network, allow_ports=ports).enforce
    network = ""
    if no_network:
        network = f", TCP only to port {', '.join(map(str, sorted(set(ports))))}" if ports else ", no TCP"
    return confine, sandbox.describe() + network, writable


def read_records(log: Path) -> list[dict[str, object]]:
    """What the shim and the hooks refused during the run (one JSON object a line; the
    first 8 MB: the agent can write this file too)."""
    found = []
    lines = (read_regular(log, 8 << 20) or b"").decode("utf-8", "replace").split("\n")
    for line in filter(None, lines):  # at newlines only: a record may hold U+2028 unescaped
        try:
            item = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            item = {"unreadable": line[:200]}  # the agent can write this file: report, don't trust
        found.append(item if isinstance(item, dict) else {"unreadable": line[:200]})
    return found


def _config_pairs(config: Path) -> list[tuple[str, str]] | None:
    """A config file's keys (None: not a regular file, or unreadable), parsed by content when small: the
    run's last snapshot parsed these same bytes, so that takes no git process."""
    data = read_regular(config, configfile.READ_LIMIT + 1)
    return None if data is None else configfile.file_entries(config, data)


def disarm(pins: Pins) -> None:
    """Remove the task's hooks and its own config before its worktree goes (a pooled one
    goes back with an admin dir of everyday files); the shared setting stays (other tasks,
    running now, rely on extensions.worktreeConfig)."""
    config = pins.admin_dir / "config.worktree"
    with admin_lock(pins.common_dir):
        if _planted(config):
            config.unlink()  # never edit through what the agent put there; the worktree goes anyway
        # First: a config.worktree as install left it goes whole (its identity keys with it), no git process.
        install.uninstall_worktree(pins.worktree, restore_shared=False, dirs=(pins.admin_dir, pins.common_dir))
        present = {key for key, _ in _config_pairs(config) or []}
        for key in WORKTREE_KEYS:
            if key.lower() in present:  # one git process for each key that is there, none for the rest
                configfile.config_file_set(config, key, None)
        if _config_pairs(config) == []:
            config.unlink()
        with contextlib.suppress(FileNotFoundError):
            (pins.admin_dir / EXCLUDES).unlink()
