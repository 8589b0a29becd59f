"""Recognise git's own report that a sandbox kept it from creating a lock file.

An agent whose OS sandbox does not cover a linked worktree's git metadata loses every
commit to a line like (git 2.39, reproduced in tests/detect/test_signatures.py):

    fatal: Unable to create '/r/.git/worktrees/t/index.lock': Permission denied
    fatal: cannot lock ref 'HEAD': Unable to create '/r/.git/refs/heads/ccm/t.lock': Permission denied
    error: Unable to create '/r/.git/worktrees/t/index.lock': Operation not permitted

(`error:` is what the sequencer prints for cherry-pick/revert before its own fatal).
The reason depends on the sandbox: Landlock gives EACCES, macOS Seatbelt and immutable
directories EPERM, a read-only bind mount (bubblewrap) EROFS.

The agent writes its own output, so the match is strict (docs/design-notes.md#the-error-signature):
the line must *start* with git's `fatal:`/`error:` prefix (a summary that quotes the
line does not count), `.lock` must be followed by the closing quote or `:` (so
`index.lock.bak` and `index.lock/x` do not count), the path must be absolute and lie
inside this task's own git directories, and only the three denial reasons count
(`File exists` is another git process, not a sandbox). Even so a match is only a hint:
recovery commits nothing the agent could not have committed itself.

Only the agent's locale's English messages are recognised; the runner should give the
agent LC_MESSAGES=C if it wants recovery to work under another language.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import NamedTuple

REASONS = ("Operation not permitted", "Permission denied", "Read-only file system")

# CSI (colours, cursor moves), OSC (titles, hyperlinks) and the two-byte escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
# A CR alone returns to the start of the line (progress meters), so each CR starts a line.
_LINES = re.compile(r"\r\n|\r|\n")
_REF = r"'[^'\n]*'"
_SIGNATURE = re.compile(
    r"(?P<level>fatal|error): "
    # The context git puts before the lock message when a ref update fails.
    rf"(?:update_ref failed for ref {_REF}: )?(?:cannot lock ref {_REF}: )?"
    r"Unable to create "
    r"(?:'(?P<quoted>/[^\n]*?\.lock)'|(?P<bare>/[^\n']*?\.lock))"
    rf": (?P<reason>{'|'.join(REASONS)})"
)
# Top-level files of a common dir that every worktree shares; its other top-level files
# (index, HEAD, ORIG_HEAD, ...) belong to the main worktree, not to a linked one.
_SHARED_TOP = frozenset({"packed-refs.lock", "config.lock", "shallow.lock"})


class Signature(NamedTuple):
    line: str  # the matching line, colour codes and surrounding blanks removed
    lock: Path  # the lock file git could not create, its directory's real path
    reason: str  # one of REASONS


def find_blocked_commit(text: str, git_dirs: list[Path]) -> Signature | None:
    """The first line of `text` that is git failing to create a lock in `git_dirs`, if any.

    `git_dirs` is the task's admin dir and its common dir (or just the git dir of a main
    worktree); they are compared by real path, as the lock's directory is.
    """
    dirs = [Path(os.path.realpath(d)) for d in git_dirs]
    for raw in _LINES.split(_ANSI.sub("", text)):
        line = raw.strip(" \t")
        found = _SIGNATURE.fullmatch(line)
        if found is None:
            continue
        lock = _real_lock(found["quoted"] or found["bare"])
        if _belongs(lock, dirs):
            return Signature(line, lock, found["reason"])
    return None


def _real_lock(path: str) -> Path:
    # The lock itself was never created; its directory exists and may be reached
    # through a symlink (macOS /tmp, a symlinked state home), so resolve that.
    lock = Path(path)
    return Path(os.path.realpath(lock.parent), lock.name)


def _belongs(lock: Path, dirs: list[Path]) -> bool:
    """Whether `lock` is this task's: inside a given dir, not another worktree's state."""
    if not any(lock.is_relative_to(d) for d in dirs):
        return False
    for common in dirs:
        admin = _admin_dir_of(lock, common)
        if admin is not None and admin not in dirs:
            return False  # another worktree's admin dir under the shared common dir
        linked = any(d.parent == common / "worktrees" for d in dirs)
        if linked and lock.parent == common and lock.name not in _SHARED_TOP:
            return False  # the main worktree's index/HEAD, not the linked task's
    return True


def _admin_dir_of(lock: Path, common: Path) -> Path | None:
    worktrees = common / "worktrees"
    if not lock.is_relative_to(worktrees) or lock.parent == worktrees:
        return None
    return worktrees / lock.relative_to(worktrees).parts[0]


_NO_IDENTITY = re.compile(r"unable to auto-detect email address|empty ident name|Author identity unknown"
                          r"|Please tell me who you are|no (email|name) was given and auto-detection is disabled")


def identity_missing(errors: str) -> bool:
    """Whether one of the agent's git commands failed for want of an identity."""
    return _NO_IDENTITY.search(errors) is not None


def git_errors(trace: str) -> str:
    """The errors in git's trace2 event stream (GIT_TRACE2_EVENT), as git printed them.

    Every git the agent ran, however it was started, logs its die()/error() messages there
    even when the agent's CLI keeps git's stderr to itself (codex exec shows it only to the
    model). The agent can write that file too, so its lines are held to the same rules as
    its output."""
    lines = []
    for raw in trace.split("\n"):  # git's JSON leaves U+2028 unescaped: newlines only
        if '"event":"error"' not in raw:
            continue
        try:
            event = json.loads(raw)
        except json.JSONDecodeError:
            continue
        message = event.get("msg") if isinstance(event, dict) else None
        if isinstance(message, str):
            lines.append(f"fatal: {message}")
    return "\n".join(lines)
