"""What is staged for a commit, checked against a role's path rules: the guard hooks'
pre-commit check (and `check-paths --staged`).

A hook is a fresh Python on every commit the agent makes, so this reads git through
git.base (no subprocess, dataclasses or pathlib to import) and judges with
pathrules.check, the same judgement a run's gate makes. git is asked as it is for the
commit being made: from the work tree top, with git's own location variables (GIT_DIR,
GIT_INDEX_FILE, ...), so `git commit -a` and `git commit PATH` are judged by the index
they commit from, not by the one they leave alone.
"""

from __future__ import annotations

import os

from ccm_guard.git import base
from ccm_guard.pathrules.check import SYMLINK, PathChange, Violation, check

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ccm_guard.pathrules.rules import Rules


def violations(rules: Rules, top: str) -> list[Violation]:
    """Every violation of `rules` by what is staged in the work tree at `top`."""
    locations = {name: os.path.join(top, os.environ[name]) for name in base.LOCATIONS if os.environ.get(name)}
    env = base.environment(locations)

    def git(args: list[str], input: bytes = b"") -> bytes:
        code, out, err = base.start(args, cwd=top, env=env, input=input)
        if code != 0:
            from ccm_guard.errors import GitError

            raise GitError(base.describe(args, code, err))
        return out

    def names(args: list[str]) -> list[str]:
        return git(args).decode("utf-8", "surrogateescape").split("\0")

    raw = names(["diff", "--cached", "-z", "--raw", "--no-renames", "--no-abbrev", "--no-ext-diff",
                 "--ignore-submodules=none"])  # a .gitmodules saying `ignore = all` must not hide a gitlink
    changes = base.raw_changes(raw, "staged", PathChange)
    links = [c.new_blob for c in changes if c.new_mode == SYMLINK and c.new_blob]
    targets = base.batch_contents(git(["cat-file", "--batch"], "".join(f"{i}\n" for i in links).encode())
                                  ) if links else {}

    def target(c: PathChange) -> str | None:
        data = targets.get(c.new_blob or "")
        return None if data is None else data.decode("utf-8", "surrogateescape")

    return check(changes, rules, target, lambda: [p for p in names(["ls-files", "-z", "--cached"]) if p])


def refusals(rules: Rules, top: str) -> list[str]:
    """What a guard hook refuses the commit for: the failing violations, one line each
    (a warning, such as a file made executable, does not stop a commit)."""
    return [v.line() for v in violations(rules, top) if v.severity == "fail"]
