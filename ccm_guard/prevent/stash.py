"""`git stash` for an agent under ccm-guard's sandbox, on its worktree's own stash.

git keeps every worktree's stash on one ref, refs/stash, in the shared git dir. The
sandbox keeps that read-only (granting it would grant every ref beside it), so a benign
`git stash` failed with "Cannot save the current status". Under the sandbox the shim
hands `git stash` to this module instead, which keeps the entries on the worktree's own
ref, refs/worktree/stash (in its admin dir, which the sandbox lets it write); a
`stash@{N}` the agent names is an entry of that. No entry of the person's is seen or
touched, so `drop` and `clear` are allowed too.

Covered: push and save of tracked changes (with a message, quietly), list, show, apply,
pop, drop, clear, store and create. Anything else (-u, -p, --keep-index, pathspecs,
branch) runs as git's own, which fails under the sandbox as before and the shim says why.

Run by the shim as `python -I -S -c ... PYPATH G_N ARGS...`: ARGS is the agent's whole
command line, G_N how many of its words are git's global options (the shim checked
them); the real git is $CCM_GUARD_REAL_GIT.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

REF = "refs/worktree/stash"
_ENTRY = re.compile(r"(?:refs/)?stash@\{(\d+)\}|(\d+)")


def main(argv: list[str]) -> int:
    globals_count, args = int(argv[0]), argv[1:]
    return Stash(args[:globals_count]).run(args[globals_count + 1:])  # the word after the globals is `stash`


class Unreadable(Exception):
    """The stash's files are not as git leaves them (unreadable, not a file): refuse."""


class Stash:
    def __init__(self, globals_: list[str]) -> None:
        self.globals = globals_
        self.env = {**os.environ, "CCM_GUARD_SHIM_ACTIVE": "1", "GIT_TEST_DISALLOW_ABBREVIATED_OPTIONS": "1"}
        self._git_dir: str | None = None

    def git_dir(self) -> str:
        if self._git_dir is None:
            self._git_dir = self.git("rev-parse", "--absolute-git-dir").stdout.strip()
        return self._git_dir

    def count(self) -> int:
        """How many entries the stash holds: the lines of its reflog. Not `REF@{0}`, which
        git answers with the ref's own value when the reflog is empty. A reflog that cannot
        be read is an error, never "none": nothing is deleted or reset on a guess."""
        try:
            with open(os.path.join(self.git_dir(), "logs", REF), "rb") as fh:
                return sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise Unreadable(f"error: the stash's reflog cannot be read ({exc.strerror}): nothing was changed") from exc

    def value(self) -> str:
        """The ref's own value ("" where there is none)."""
        return self.git("rev-parse", "--verify", "--quiet", REF).stdout.strip()

    def git(self, *args: str, capture: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([os.environ["CCM_GUARD_REAL_GIT"], *self.globals, *args], env=self.env, text=True,
                              stdout=subprocess.PIPE if capture else None, errors="surrogateescape")

    def as_git(self, args: list[str]) -> int:
        """git's own stash, for what is not covered here: where it saves, it fails under the
        sandbox, and git says only "Cannot save the current status"."""
        code = self.git("stash", *args, capture=False).returncode
        if code != 0:
            print("ccm-guard: this form of git stash (-u, -a, -p, --keep-index, --staged, a pathspec) writes "
                  "refs/stash, which is shared by every worktree, so ccm-guard's sandbox keeps it read-only; "
                  "plain `git stash` of tracked changes works (on this worktree's own stash), or keep the work in "
                  "a commit (git commit -m WIP, then git reset --soft HEAD~1) or a patch (git diff > FILE)",
                  file=sys.stderr)
        return code

    def run(self, args: list[str]) -> int:
        try:
            return self._run(args)
        except Unreadable as exc:
            print(exc, file=sys.stderr)
            return 1

    def _run(self, args: list[str]) -> int:
        sub, rest = (args[0], args[1:]) if args and not args[0].startswith("-") else ("push", args)
        handler = {"push": self.push, "save": self.save, "list": self.listing, "show": self.show, "apply": self.apply,
                   "pop": self.pop, "drop": self.drop, "clear": self.clear, "store": self.store}.get(sub)
        if sub == "create" or handler is None:
            return self.as_git(args)
        return handler(rest, args)

    # --- saving -----------------------------------------------------------------------------

    def push(self, rest: list[str], args: list[str]) -> int:
        message, quiet, i = None, False, 0
        while i < len(rest):
            word = rest[i]
            if word in ("-q", "--quiet"):
                quiet = True
            elif word in ("-m", "--message") and i + 1 < len(rest):
                message, i = rest[i + 1], i + 1
            elif word.startswith("--message="):
                message = word.split("=", 1)[1]
            elif word.startswith("-m") and len(word) > 2:
                message = word[2:]
            elif word == "--" and i == len(rest) - 1:
                pass  # no pathspec after it
            else:
                return self.as_git(args)  # -u, -k, -p, --staged, a pathspec: git's own
            i += 1
        return self._save(message, quiet)

    def save(self, rest: list[str], args: list[str]) -> int:
        quiet = bool(rest) and rest[0] in ("-q", "--quiet")
        words = rest[1:] if quiet else rest
        if any(w.startswith("-") for w in words):
            return self.as_git(args)
        return self._save(" ".join(words) or None, quiet)

    def _save(self, message: str | None, quiet: bool) -> int:
        made = self.git("stash", "create", *([message] if message else []))
        if made.returncode != 0:
            return made.returncode
        commit = made.stdout.strip()
        if not commit:
            if not quiet:
                print("No local changes to save")
            return 0
        subject = self.git("log", "-1", "--format=%s", commit).stdout.strip()
        logged = self._log_entry(commit, subject)
        if logged != 0:
            return logged
        # Only now, as git stash push does after saving: the changes are in an entry.
        reset = self.git("reset", "--hard", "-q", "--no-recurse-submodules", capture=False)
        if reset.returncode == 0 and not quiet:
            print(f"Saved working directory and index state {subject}")
        return reset.returncode

    def store(self, rest: list[str], args: list[str]) -> int:
        message, commits, i = 'Created via "git stash store".', [], 0
        while i < len(rest):
            if rest[i] in ("-m", "--message") and i + 1 < len(rest):
                message, i = rest[i + 1], i + 1
            elif rest[i].startswith("--message="):
                message = rest[i].split("=", 1)[1]
            elif rest[i] not in ("-q", "--quiet"):
                commits.append(rest[i])
            i += 1
        if len(commits) != 1:
            return self.as_git(args)
        commit = self.git("rev-parse", "--verify", "--quiet", f"{commits[0]}^{{commit}}").stdout.strip()
        if not commit:
            print(f"error: {commits[0]} is not a commit: cannot store it on the stash", file=sys.stderr)
            return 1
        return self._log_entry(commit, message)

    def _log_entry(self, commit: str, message: str) -> int:
        """`commit` as the newest entry, or an error: an entry is a line of the reflog, and
        git writes none for an update to the value the ref has already."""
        before = self.count()
        if before == 0 and self.value() == commit:
            # A ref left at this very value with no entries (a killed drop): started afresh, or
            # git would log nothing. A ref at another value keeps it as the entry's old value.
            self._delete()
        stored = self.git("update-ref", "--create-reflog", "-m", message, REF, commit, capture=False)
        if stored.returncode != 0:
            return stored.returncode
        if self.count() != before + 1:
            print("error: could not save the stash entry (the same changes are the newest entry already); "
                  "nothing was reset", file=sys.stderr)
            return 1
        return 0

    # --- entries ----------------------------------------------------------------------------

    def _entry(self, words: list[str], *, ref_only: bool) -> tuple[str | None, list[str]]:
        """The entry the words name (stash@{N}, N, or the newest) as REF@{N}, and the other
        words (options); None where a word names no entry of this stash (`ref_only`) or
        there are none."""
        options = [w for w in words if w.startswith("-")]
        named = [w for w in words if not w.startswith("-")]
        if len(named) > 1:
            return None, options
        if not named:
            return (f"{REF}@{{0}}" if self.count() else None), options
        found = _ENTRY.fullmatch(named[0])
        if found:
            return f"{REF}@{{{found.group(1) or found.group(2)}}}", options
        return (None if ref_only else named[0]), options

    def _missing(self, words: list[str]) -> int:
        named = [w for w in words if not w.startswith("-")]
        print(f"error: {named[0]!r} is not a stash entry" if named else "No stash entries found.", file=sys.stderr)
        return 1

    def listing(self, rest: list[str], args: list[str]) -> int:
        if not self.count():
            return 0
        shown = self.git("log", "--format=%gD: %gs", "-g", "--first-parent", "-m", *rest, REF, "--")
        sys.stdout.write(shown.stdout.replace(f"{REF}@{{", "stash@{"))
        return shown.returncode

    def show(self, rest: list[str], args: list[str]) -> int:
        entry, options = self._entry(rest, ref_only=False)
        if entry is None:
            return self._missing(rest)
        return self.git("stash", "show", *options, entry, capture=False).returncode

    def apply(self, rest: list[str], args: list[str]) -> int:
        entry, options = self._entry(rest, ref_only=False)
        if entry is None:
            return self._missing(rest)
        return self.git("stash", "apply", *options, entry, capture=False).returncode

    def pop(self, rest: list[str], args: list[str]) -> int:
        entry, options = self._entry(rest, ref_only=True)
        if entry is None:
            return self._missing(rest)
        applied = self.git("stash", "apply", *options, entry, capture=False)
        if applied.returncode != 0:
            print("The stash entry is kept in case you need it again.")
            return applied.returncode
        return self._drop(entry, quiet="-q" in options or "--quiet" in options)

    def drop(self, rest: list[str], args: list[str]) -> int:
        entry, options = self._entry(rest, ref_only=True)
        if entry is None:
            return self._missing(rest)
        return self._drop(entry, quiet="-q" in options or "--quiet" in options)

    def _drop(self, entry: str, *, quiet: bool) -> int:
        commit = self.git("rev-parse", "--verify", "--quiet", entry).stdout.strip()
        if not commit:
            print(f"error: {entry.replace(REF, 'stash')} is not a stash entry", file=sys.stderr)
            return 1
        dropped = self.git("reflog", "delete", "--updateref", "--rewrite", entry, capture=False)
        if dropped.returncode != 0:
            return dropped.returncode
        if self.count() == 0:
            self._delete()  # the last one: the ref goes too, as git's does
        if not quiet:
            print(f"Dropped {entry.replace(REF, 'stash')} ({commit})")
        return 0

    def clear(self, rest: list[str], args: list[str]) -> int:
        if self.count():
            self._delete()
        return 0

    def _delete(self) -> None:
        """The ref and its reflog gone. Not `update-ref -d`: git locks the shared packed-refs
        to delete any ref, which the sandbox does not let it create; a per-worktree ref is
        never packed, so its two files are all of it."""
        git_dir = self.git_dir()
        # The reflog first: where it cannot go, the ref stays too, and nothing is lost.
        for path in (os.path.join(git_dir, "logs", REF), os.path.join(git_dir, REF)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise Unreadable(f"error: {path} cannot be removed ({exc.strerror}): the ref is left as it is") from exc
        # And the directories it made, when empty: an admin dir of everyday files only goes
        # back to the warm pool.
        for directory in ("refs/worktree", "refs", "logs/refs/worktree", "logs/refs"):
            try:
                os.rmdir(os.path.join(git_dir, directory))
            except OSError:
                pass
