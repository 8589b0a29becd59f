"""ccm-guard's hook scripts and the task settings file they read.

One sh template (hooks/hook.sh, package data) filled in the way pre-commit fills its
own: a marked block of shell-quoted values (the resolved interpreter, the hook name,
where the task settings are, which hook to chain), an id line that tells our files
from anyone else's (`HOOK_ID`, and `PRIOR_IDS` for earlier templates).

A hooks dir of ours holds a script for each of `GUARD_HOOKS`, and a chain-only one for
any other hook the hooks dir it replaces holds; each chains that dir's hook by its path.
"""

from __future__ import annotations

import functools
import os
import shlex
import site
import sys
from pathlib import Path
from typing import Sequence

from ccm_guard.errors import UsageError
from ccm_guard.files import replace_file
from ccm_guard.prevent.hookreport import Report
from ccm_guard.prevent.resources import data_file

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
ID_LINE = "# ccm-guard hook id: "
PRIOR_IDS: tuple[str, ...] = ()  # add the old id here whenever hook.sh's id changes
BLOCK_BEGIN = "# --- ccm-guard values: begin"
BLOCK_END = "# --- ccm-guard values: end"


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
    replace_file(path, text.encode(), 0o755)


# --- a hooks dir that chains another ---------------------------------------------------


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


def write_chaining_dir(directory: Path, prev: str, base: Path, *, settings: str, tasks: str,
                       checks: dict[str, bool], report: Report) -> None:
    """Our hooks in `directory`, each chaining hooks dir `prev` by path; a chain-only
    script for any other hook `prev` holds. Each guard hook is written even with nothing
    to check: the hook it chains may appear later (husky writes its own during setup's
    `npm install`), and the script looks for it on every run."""
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


# --- the task settings file ------------------------------------------------------------


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
    replace_file(path, (text + "".join(f"{k}={v}\n" for k, v in values)).encode(), 0o644)
