"""Agent profiles: which agent a command is, and what each one needs to work in a guarded
worktree (its arguments, how to tell it about the task's other roots).

An agent is recognised from the program that really runs, not from the word the person
typed: `claude`, `/opt/x/claude.exe`, `node …/@anthropic-ai/claude-code/cli.js`,
`…/.bin/codex` (a link to codex.js) or the native `codex` binary, `python -m aider`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

PROFILES = ("codex", "claude", "gemini", "aider", "generic")

# Program file names (after following links) that are the agent itself.
_PROGRAMS = {
    "claude": "claude", "claude.exe": "claude", "cli.js": None,  # cli.js: decided by its package
    "codex": "codex", "codex.js": "codex", "codex.exe": "codex",
    "gemini": "gemini", "gemini.js": "gemini",
    "aider": "aider",
}
# Package directories in a script's resolved path.
_PACKAGES = (("@anthropic-ai/claude-code", "claude"), ("@openai/codex", "codex"),
             ("@google/gemini-cli", "gemini"), ("site-packages/aider", "aider"))
_INTERPRETER = re.compile(r"(node|nodejs|bun|deno|python(\d+(\.\d+)?)?|pypy3?)$")
# Interpreter options that take a value, so the script is the word after it.
_INTERPRETER_VALUE_OPTIONS = {"-r", "--require", "--import", "--loader", "-W", "-X", "--max-old-space-size"}


class Launch(NamedTuple):
    """Which agent a command runs, and where the agent's own arguments start in it."""

    profile: str
    head: int  # command[:head] is the launcher: the program, or an interpreter and its script


def launch_of(command: list[str], forced: str | None = None) -> Launch:
    found = _detect(command)
    if forced:
        return Launch(forced, found.head)
    return found


def profile_of(command: list[str], forced: str | None = None) -> str:
    return launch_of(command, forced).profile


def _detect(command: list[str]) -> Launch:
    program = command[0]
    name = _by_path(program)
    if name:
        return Launch(name, 1)
    if _INTERPRETER.match(Path(program).name):
        args = command[1:]
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "-m" and i + 1 < len(args):  # python -m aider
                module = args[i + 1].split(".")[0]
                return Launch(module if module in PROFILES else "generic", i + 3)
            if arg in _INTERPRETER_VALUE_OPTIONS:
                i += 2
                continue
            if arg.startswith("-"):
                i += 1
                continue
            return Launch(_by_path(arg) or "generic", i + 2)  # the script
    return Launch("generic", 1)


def _by_path(program: str) -> str | None:
    """The agent a program file is, by its name as typed, its real name, or its package."""
    candidates = [program]
    try:
        candidates.append(os.path.realpath(program))
    except OSError:
        pass
    for path in candidates:
        base = Path(path).name
        known = _PROGRAMS.get(base)
        if known is None and base.startswith("codex-"):
            known = "codex"  # the native binaries: codex-x86_64-unknown-linux-musl, ...
        if known:
            return known
        for package, profile in _PACKAGES:
            if f"/{package}/" in path:
                return profile
    return None


def with_add_dirs(command: list[str], head: int, task_roots: list[Path]) -> list[str]:
    """Codex's own workspace-write sandbox knows nothing of linked worktrees: a commit
    needs the git metadata outside its cwd (docs/design-notes.md#agents-with-a-sandbox-of-their-own).
    Tell it the roots a commit needs besides the worktree."""
    return _codex_options(command, head, [arg for root in task_roots[1:] for arg in ("--add-dir", str(root))])


OUTER = "danger-full-access"
_SHORT = {"-s": "--sandbox", "-c": "--config", "-p": "--profile"}


class _Setting(NamedTuple):
    at: int  # the word that holds the value
    prefix: str  # what comes before the value in that word ("", "--sandbox=", "-s")
    option: str  # --sandbox, --config or --profile
    value: str


def _codex_settings(args: Sequence[str]) -> Iterator[_Setting]:
    """Codex's --sandbox, --config and --profile in every form (`-s X`, `--sandbox X`,
    `--sandbox=X`, `-sX`), up to `--`."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return
        long = next((name for name in _SHORT.values() if arg.startswith(name + "=")), None)
        if long:
            yield _Setting(i, long + "=", long, arg[len(long) + 1:])
        elif (arg in _SHORT or arg in _SHORT.values()) and i + 1 < len(args):
            yield _Setting(i + 1, "", _SHORT.get(arg, arg), args[i + 1])
            i += 1
        elif arg[:2] in _SHORT and len(arg) > 2:
            yield _Setting(i, arg[:2], _SHORT[arg[:2]], arg[2:])
        i += 1


def _config_key(value: str) -> str:
    return value.split("=", 1)[0].strip()


def without_own_sandbox(command: list[str], head: int) -> list[str]:
    """Codex's workspace-write sandbox cannot run inside ccm-guard's: its bubblewrap must
    write /proc/self/uid_map, which Landlock keeps read-only, and its legacy Landlock mode
    refuses to run without bubblewrap. Inside ccm-guard's sandbox, which confines its
    commands' writes at least as narrowly, codex runs them unsandboxed itself. Every
    choice of a sandbox on the command line is rewritten (a later -c would win over the
    one added in front, which covers config.toml and a profile)."""
    args = list(command)
    for setting in _codex_settings(command[head:]):
        at = head + setting.at
        if setting.option == "--sandbox":
            args[at] = setting.prefix + OUTER
        elif setting.option == "--config" and _config_key(setting.value) == "sandbox_mode":
            args[at] = setting.prefix + f'sandbox_mode="{OUTER}"'
    return _codex_options(args, head, ["-c", f'sandbox_mode="{OUTER}"'])


def _codex_options(command: list[str], head: int, options: list[str]) -> list[str]:
    at = head + 1 if len(command) > head and command[head] == "exec" else head
    return [*command[:at], *options, *command[at:]]


def codex_workspace_write(args: list[str], codex_home: Path | None) -> bool:
    """Whether codex will run its own workspace-write sandbox, however it was chosen: -s /
    --sandbox, -c sandbox_mode=..., a --profile (`<name>.config.toml` in its home, or a
    [profiles] table), or config.toml in its home."""
    mode: str | None = None
    profile: str | None = None
    for setting in _codex_settings(args):
        if setting.option == "--sandbox":
            mode = setting.value
        elif setting.option == "--config" and _config_key(setting.value) == "sandbox_mode":
            mode = setting.value.split("=", 1)[1].strip().strip("\"'") if "=" in setting.value else None
        elif setting.option == "--profile":
            profile = setting.value
    if "--dangerously-bypass-approvals-and-sandbox" in args:
        mode = mode or "danger-full-access"
    elif "--full-auto" in args:  # codex before 0.1xx: workspace-write, on request
        mode = mode or "workspace-write"
    if mode is None and codex_home is not None:
        config = _toml(codex_home / "config.toml")
        chosen = profile or config.get("profile")
        if isinstance(chosen, str) and "/" not in chosen:
            profiles = config.get("profiles")
            table = profiles.get(chosen) if isinstance(profiles, dict) else None
            mode = (table if isinstance(table, dict) else _toml(codex_home / f"{chosen}.config.toml")).get(
                "sandbox_mode")
        if mode is None:
            mode = config.get("sandbox_mode")
    return mode == "workspace-write"


def _toml(path: Path) -> dict[str, Any]:
    import tomllib  # here: only a codex run reads its config.toml

    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError):
        return {}


# Where each agent's model lives by default (HTTPS), and the variables that move it.
_MODEL_URLS = {
    "claude": ("ANTHROPIC_BASE_URL",),
    "codex": ("OPENAI_BASE_URL",),
    "aider": ("OPENAI_API_BASE", "OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "OLLAMA_API_BASE"),
    "gemini": ("GOOGLE_GEMINI_BASE_URL", "GEMINI_API_BASE_URL"),
}


def model_ports(profile: str, environ: Mapping[str, str], args: Sequence[str] = (),
                codex_home: Path | None = None) -> tuple[int, ...]:
    """The TCP ports a known agent needs to reach its model: 443, and the port of any base
    URL its variables name (for codex also its `-c …base_url=` options and config.toml's
    model providers). A generic command gets none: only --allow-port opens one."""
    if profile not in _MODEL_URLS:
        return ()
    urls = [environ.get(name, "") for name in _MODEL_URLS[profile]]
    if profile == "codex":  # its -c options only: a prompt that mentions a URL opens nothing
        urls += [c.value.split("=", 1)[1].strip().strip("\"'") for c in _codex_settings(args)
                 if c.option == "--config" and "=" in c.value and _config_key(c.value).endswith("base_url")]
        providers = _toml(codex_home / "config.toml").get("model_providers") if codex_home else None
        if isinstance(providers, dict):
            urls += [p.get("base_url", "") for p in providers.values() if isinstance(p, dict)]
    import urllib.parse  # here: it costs ~4 ms to import (ipaddress), and only --no-network asks

    ports = {443}
    for url in urls:
        if not isinstance(url, str) or not url:
            continue
        try:
            parsed = urllib.parse.urlsplit(url)
            ports.add(parsed.port or (80 if parsed.scheme == "http" else 443))
        except ValueError:
            continue
    return tuple(sorted(ports))
