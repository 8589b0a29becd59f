"""Task-private agent homes: the agent's own configuration directory, seeded from the person's.

An agent keeps credentials, settings, hooks, MCP servers and session history in its home
(`~/.claude`, `~/.codex`, `~/.gemini`). Letting it write the person's copy hands it code
execution in the person's next session (a planted hook runs outside any sandbox). So each
run gets its own home under the task's state, pointed at by the agent's documented
variable (CLAUDE_CONFIG_DIR, CODEX_HOME, GEMINI_CLI_HOME), seeded with copies of the
person's credentials and settings. Nothing is ever written back; `watched` files are read
before and after the run, and detect.agent_home judges what changed.

The person's trust of the repository is carried over to the task's worktree path, where
the agent keeps such a list, so the "trust this folder?" question is not asked per task.

A fresh home makes some CLIs slower to start: Codex creates and migrates six SQLite
databases on its first start (about 70 ms). Those first-start files are kept once per
installed version of the CLI as a template (made by ccm-guard running the CLI without a
model in a scratch home, never taken from an agent's run or from the person's own
databases, which hold their sessions), and copied into each new private home.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from ccm_guard.digest import sha256_hex
from ccm_guard.files import read_regular, replace_file

# Larger files are not read for judging, nor parsed for trust (a home's settings are small).
READ_LIMIT = 16 << 20


class Home(NamedTuple):
    profile: str
    path: Path  # the task's private home for the agent
    env: dict[str, str]  # the variables that point the agent at it
    seeded_from: Path | None  # the person's home it was copied from (None: fresh)
    watched: tuple[str, ...]  # paths (relative to `path`) whose changes are judged
    unwatched: tuple[str, ...] = ()  # prefixes below them that the CLI rewrites itself
    # The first-start template to build for later tasks (build_template), when there is none yet.
    template_wanted: Path | None = None

    def read_watched(self) -> dict[str, bytes]:
        """The watched files as they are now (directories walked, links not followed)."""
        found: dict[str, bytes] = {}
        for name in _expand(self.path, self.watched):
            top = self.path / name
            if top.is_dir() and not top.is_symlink():
                for root, dirs, files in os.walk(top):
                    dirs.sort()
                    # A link to a directory is listed with the directories and not walked.
                    links = [d for d in dirs if os.path.islink(os.path.join(root, d))]
                    for file in sorted(files + links):
                        full = Path(root, file)
                        name = str(full.relative_to(self.path))
                        if not name.startswith(self.unwatched):
                            found[name] = _read(full)
            elif os.path.lexists(top):
                found[name] = _read(top)
        return found


def _read(path: Path) -> bytes:
    """A watched file's content; a link, a FIFO or a device as what it is, never opened."""
    try:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            return b"symlink -> " + os.fsencode(os.readlink(path))
    except OSError as exc:
        return f"unreadable: {exc.strerror}".encode()
    data = read_regular(path, READ_LIMIT)
    return data if data is not None else f"not a regular file (mode {info.st_mode:o})".encode()


class _Spec(NamedTuple):
    variable: str  # the agent's documented home variable
    default: str  # the home's place under $HOME when the variable is not set
    subdir: str  # inside the variable's directory, where the state lives ("" for itself)
    seed: tuple[str, ...]  # what is copied from the person's home
    watched: tuple[str, ...]
    trust: Callable[[Path, Path, Path], None] | None  # (home state dir, main worktree, task worktree)
    unwatched: tuple[str, ...] = ()
    # What the CLI creates on its first start that a template may seed (file patterns), and
    # the arguments that make it create them without a model and exit.
    first_start: tuple[str, ...] = ()
    probe: tuple[str, ...] = ()


def _claude_trust(state: Path, main: Path, worktree: Path) -> None:
    path = state / ".claude.json"
    data = _json(path)
    projects = data.get("projects")
    if not isinstance(projects, dict):
        return
    entry = _trusted_entry(projects, main, lambda e: isinstance(e, dict) and e.get("hasTrustDialogAccepted") is True)
    if entry is None:
        return
    projects[str(worktree)] = {"hasTrustDialogAccepted": True,
                               "hasCompletedProjectOnboarding": bool(entry.get("hasCompletedProjectOnboarding")),
                               "allowedTools": []}
    replace_file(path, json.dumps(data, indent=2).encode())


def _codex_trust(state: Path, main: Path, worktree: Path) -> None:
    import tomllib

    path = state / "config.toml"
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return
    projects = data.get("projects")
    if not isinstance(projects, dict) or str(worktree) in projects:
        return
    if _trusted_entry(projects, main, lambda e: isinstance(e, dict) and e.get("trust_level") == "trusted") is None:
        return
    # A TOML basic string is JSON's string syntax for these characters; the table is new.
    text = path.read_text() + f'\n[projects.{json.dumps(str(worktree))}]\ntrust_level = "trusted"\n'
    try:
        tomllib.loads(text)
    except ValueError:
        return  # projects written as an inline table: leave the file as the person has it
    replace_file(path, text.encode())


def _gemini_trust(state: Path, main: Path, worktree: Path) -> None:
    path = state / "trustedFolders.json"
    data = _json(path)
    if _trusted_entry(data, main, lambda e: e == "TRUST_FOLDER") is not None:  # it trusts what is below it
        data[str(worktree)] = "TRUST_FOLDER"
        replace_file(path, json.dumps(data, indent=2).encode())


def _trusted_entry(projects: Mapping[str, object], main: Path, trusted: Callable[[object], bool]) -> Any:
    """The person's entry that trusts the main worktree (or a folder above it), or None."""
    return next((projects[str(f)] for f in (main, *main.parents) if trusted(projects.get(str(f)))), None)


_SPECS = {
    "claude": _Spec(
        variable="CLAUDE_CONFIG_DIR", default=".claude", subdir="",
        seed=("settings.json", ".credentials.json", "CLAUDE.md", "agents", "commands", "skills",
              "output-styles", "plugins", "hooks"),
        watched=("settings.json", "settings.local.json", ".claude.json", "CLAUDE.md", "agents", "commands",
                 "skills", "output-styles", "plugins", "hooks"),
        # A usage queue Claude writes on every first start, not a plugin.
        unwatched=("plugins/store/",),
        trust=_claude_trust),
    "codex": _Spec(
        variable="CODEX_HOME", default=".codex", subdir="",
        # Codex 0.169 keeps each --profile in <name>.config.toml beside config.toml.
        seed=("config.toml", "*.config.toml", "auth.json", "AGENTS.md", "AGENTS.override.md", "instructions.md",
              "prompts", "rules", "skills", ".env"),
        watched=("config.toml", "*.config.toml", "AGENTS.md", "AGENTS.override.md", "instructions.md", "prompts",
                 "rules", "skills", "hooks.json", ".env"),
        # Codex unpacks its built-in skills there on every start.
        unwatched=("skills/.system/",),
        trust=_codex_trust,
        # Its databases (state, logs, memories, goals, queue), made and migrated on first
        # start; `codex archive` of a session that does not exist makes them, then fails.
        first_start=("*_[0-9].sqlite", "*_[0-9].sqlite-wal", "*_[0-9][0-9].sqlite", "*_[0-9][0-9].sqlite-wal"),
        probe=("archive", "ccm-guard-template-probe")),
    "gemini": _Spec(
        variable="GEMINI_CLI_HOME", default=".gemini", subdir=".gemini",
        seed=("settings.json", "oauth_creds.json", "google_accounts.json", "installation_id", "trustedFolders.json", ".env",
              "GEMINI.md", "commands", "extensions", "policies"),
        watched=("settings.json", "trustedFolders.json", "GEMINI.md", "commands", "extensions", "policies", ".env"),
        trust=_gemini_trust),
}


def person_home_dir(profile: str, environ: Mapping[str, str]) -> Path | None:
    """Where the person's own copy of the agent's home is (it may not exist)."""
    spec = _SPECS.get(profile)
    if spec is None:
        return None
    home = Path(environ.get("HOME") or os.path.expanduser("~"))
    chosen = environ.get(spec.variable)
    if chosen:
        return Path(chosen) / spec.subdir if spec.subdir else Path(chosen)
    return home / spec.default


def prepare(profile: str, private: Path, *, main: Path, worktree: Path, environ: Mapping[str, str],
            launcher: Sequence[str] = (), templates: Path | None = None) -> Home | None:
    """Make (or, for a resumed task, reuse) the agent's private home under `private`;
    seeded from the first-start template under `templates` for the CLI that `launcher`
    (the agent's program, or its interpreter and script) runs, when there is one."""
    spec = _SPECS.get(profile)
    source = person_home_dir(profile, environ)
    if spec is None or source is None:
        return None
    top = private / f"{profile}-home"
    state = top / spec.subdir if spec.subdir else top
    fresh = not state.exists()
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    seeded = source if source.is_dir() else None
    if fresh:
        if seeded is not None:
            for name in _expand(source, spec.seed):
                _copy(source / name, state / name)
        if profile == "claude":
            # Claude keeps its global file beside the config dir only when the variable is
            # set; otherwise it is ~/.claude.json.
            outside = Path(environ[spec.variable]) if environ.get(spec.variable) else source.parent
            _copy(outside / ".claude.json", state / ".claude.json")
        if spec.trust is not None:
            spec.trust(state, main, worktree)
    wanted = None
    template = _template_dir(profile, launcher, templates) if fresh and spec.probe and templates else None
    if template is not None:
        if template.is_dir() and not template.is_symlink():
            for name in _expand(template, spec.first_start):
                if not (state / name).exists():  # never over a seeded file (none has these names)
                    _copy_regular(template / name, state / name)
        elif not _failed(template).exists():  # a probe that failed once is not tried again
            wanted = template
    return Home(profile=profile, path=state, env={spec.variable: str(top)}, seeded_from=seeded,
                watched=spec.watched, unwatched=spec.unwatched, template_wanted=wanted)


def _resolved(launcher: Sequence[str]) -> list[str] | None:
    """The launcher's files as absolute real paths (the program found on PATH), or None."""
    found = []
    for i, arg in enumerate(launcher):
        path = shutil.which(arg) if i == 0 else arg
        if not path or not os.path.exists(path):
            return None
        found.append(os.path.realpath(path))
    return found or None


def _template_dir(profile: str, launcher: Sequence[str], templates: Path) -> Path | None:
    """Where the template for this installed version of the CLI is: named by the identity
    (path, size, times, inode) of the files the launcher runs, so that an upgrade, which
    writes them anew (npm keeps a fixed mtime, not a fixed change time), makes a new one."""
    files = _resolved(launcher)
    if files is None:
        return None
    parts = []
    for real in files:
        try:
            info = os.stat(real)
        except OSError:
            return None
        parts.append(f"{real}\0{info.st_size}\0{info.st_mtime_ns}\0{info.st_ctime_ns}\0{info.st_ino}")
    digest = sha256_hex("\n".join(parts).encode())[:16]
    return templates / f"{profile}-{digest}"


def _copy_regular(src: Path, dst: Path) -> None:
    """A template's file, copied only if it is a regular file: a link planted there (to
    the person's own databases, their sessions) is not followed."""
    data = read_regular(src, TEMPLATE_FILE_LIMIT)
    if data is not None:
        replace_file(dst, data)


TEMPLATE_FILE_LIMIT = 64 << 20  # a first start's empty databases are kilobytes
SCRATCH_STALE = 600  # seconds: a build's scratch left by a killed ccm-guard is removed after that


def _failed(template: Path) -> Path:
    return template.with_name(template.name + ".failed")


def build_template(profile: str, launcher: Sequence[str], target: Path, *, timeout: float = 10) -> bool:
    """Run the CLI once without a model in a scratch home (its probe) and keep what its first
    start made as the template at `target`, renamed into place whole. Whether one is there
    now. Nothing of the person's or of an agent's goes in: the scratch home starts empty.
    A probe that makes nothing, or does not finish in time, is recorded as failed for this
    version (`<target>.failed`), so no later run waits for it again. Never raises: a run
    must not fail for want of a template."""
    spec, files = _SPECS[profile], _resolved(launcher)
    if files is None:
        return False
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _remove_stale_scratch(target.parent)
        scratch = Path(tempfile.mkdtemp(prefix=f".{profile}-scratch-", dir=target.parent))
    except OSError:
        return False
    try:
        made = scratch / "home"
        made.mkdir()
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(scratch), spec.variable: str(made)}
        # Its own process group: codex's launcher starts the real binary as a child, and a
        # probe that overruns is stopped whole.
        probe = subprocess.Popen([*files, *spec.probe], cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            probe.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(probe.pid, signal.SIGKILL)  # anything it left running, too
            probe.wait()
        built = scratch / "template"
        built.mkdir()
        source = made / spec.subdir if spec.subdir else made
        names = _expand(source, spec.first_start)
        if not names:
            _failed(target).touch()  # this version makes nothing on the probe: no template, as before
            return False
        for name in names:
            os.rename(source / name, built / name)
        with contextlib.suppress(OSError):
            os.rename(built, target)  # whole, or not at all: another run may have built it first
        return target.is_dir()
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            _failed(target).touch()
        return False
    except (OSError, subprocess.SubprocessError):
        return False
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _remove_stale_scratch(templates: Path) -> None:
    """Scratch homes of builds that never finished (ccm-guard was killed during one)."""
    now = time.time()
    for old in templates.glob(".*-scratch-*"):
        with contextlib.suppress(OSError):
            if now - old.lstat().st_mtime > SCRATCH_STALE:
                shutil.rmtree(old, ignore_errors=True)


def _expand(top: Path, names: tuple[str, ...]) -> list[str]:
    """The names, with a pattern ("*.config.toml") replaced by what matches in `top`."""
    found: list[str] = []
    for name in names:
        found += sorted(p.name for p in top.glob(name)) if "*" in name else [name]
    return found


def _copy(src: Path, dst: Path) -> None:
    """Copy a file or a directory tree by content: a link (a dotfile manager's) is followed,
    never copied as a link, so nothing the agent writes in its home can reach the person's
    file. What cannot be read is left out."""
    try:
        if src.is_dir():
            shutil.copytree(src, dst, symlinks=False, ignore_dangling_symlinks=True)
        elif src.is_file():
            shutil.copy2(src, dst)
    except (OSError, RecursionError):
        pass


def _json(path: Path) -> dict[str, object]:
    try:
        if path.stat().st_size > READ_LIMIT:
            return {}
        data = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
