"""The hardened core of the git gateway: the one place a git process is started.

Every git process is built by `run` (or `run_z`, whose output is read as it comes),
hardened against what an agent may have planted in the repository:

- the git dir, common dir and work tree are passed explicitly from paths pinned when
  the task was created, so a rewritten `.git` pointer, `commondir` or `core.worktree`
  cannot redirect ccm-guard to a decoy;
- hooks, fsmonitor, pagers, replace objects, grafts, the commit-graph, signing and
  auto-gc are off; the global and system config and the person's HOME are not read
  (the agent can write `$HOME/.gitconfig` when it runs unsandboxed);
- optional locks are off, so reading status never rewrites an index;
- output is `-z` and split on NUL.

Subprocess rather than plumbum: plumbum measured 50 to 66 ms at import, a third of the
budget of a whole `exec` on a small repository (docs/design-notes.md); this module is the
only place that would change if that ever flips.

The other modules of the package build their typed queries on `run`; this one imports
nothing from them.
"""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
from pathlib import Path
from typing import Generator, Mapping, NamedTuple, Sequence

from ccm_guard.errors import GitError, NotARepository, RepoError, UntrustedRepoError
from ccm_guard.git.base import HARDENING, binary, describe
from ccm_guard.git.base import environment as hardened_environment


class Repo(NamedTuple):
    """Where git must look, pinned: never rediscovered from files the agent controls."""

    git_dir: Path  # a linked worktree's admin dir, or the common dir itself
    common_dir: Path
    work_tree: Path | None = None
    # Set once the snapshot shows config or object-store steering files were changed:
    # from then on ccm-guard runs no git at all on this repository.
    untrusted: str | None = None

    def distrust(self, reason: str) -> "Repo":
        return self._replace(untrusted=reason)


class Result(NamedTuple):
    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def out(self) -> str:
        return self.stdout.decode("utf-8", "surrogateescape")

    def lines(self) -> list[str]:
        """Output of one answer a line, split at newlines only: a path or a ref name may hold
        U+2028, U+0085 or a form feed, where str.splitlines splits too ([""]: no output)."""
        return self.out.removesuffix("\n").split("\n")

    def z(self) -> list[str]:
        """NUL-separated output as a list (no trailing empty element)."""
        return [p for p in self.out.split("\0") if p]


def environment(repo: Repo | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    locations = {}
    if repo is not None:
        locations["GIT_DIR"] = str(repo.git_dir)
        locations["GIT_COMMON_DIR"] = str(repo.common_dir)
        if repo.work_tree is not None:
            locations["GIT_WORK_TREE"] = str(repo.work_tree)
    return hardened_environment(locations, extra)


def run(
    args: Sequence[str],
    repo: Repo | None = None,
    *,
    cwd: Path | str | None = None,
    input: bytes | None = None,
    check: bool = True,
    env: Mapping[str, str] | None = None,
    literal: bool = True,
    person_config: bool = False,
) -> Result:
    """Run one hardened git command; raise GitError with the whole story on failure.

    Pathspecs are literal (a file the agent named `:(glob)*` is just that file), except
    where a command refuses pathspec magic altogether (`literal=False`). `person_config`
    reads the person's own global and system config (their identity), which every other
    call ignores; reading config runs nothing.
    """
    argv, cwd = _command(args, repo, cwd=cwd, literal=literal)
    try:
        proc = subprocess.run(
            argv,
            cwd=cwd,
            input=input,
            stdin=None if input is not None else subprocess.DEVNULL,
            capture_output=True,
            env=_with_person_config(environment(repo, env)) if person_config else environment(repo, env),
            check=False,
        )
    except OSError as exc:
        raise GitError(f"could not start git ({exc.strerror}): check that {argv[0]} works") from exc
    result = Result(tuple(args), proc.returncode, proc.stdout, proc.stderr)
    if check and proc.returncode != 0:
        raise GitError(describe_failure(result))
    return result


def _command(args: Sequence[str], repo: Repo | None, *, cwd: Path | str | None, literal: bool
             ) -> tuple[tuple[str, ...], Path | str]:
    """The hardened argv and the directory git runs in; refused on a distrusted repository."""
    if repo is not None and repo.untrusted:
        raise UntrustedRepoError(
            f"refusing to run git on {repo.common_dir}: {repo.untrusted}; "
            "inspect the repository by hand before trusting it again"
        )
    argv = (binary(), *HARDENING, *(("--literal-pathspecs",) if literal else ()), *args)
    if cwd is None:
        cwd = repo.work_tree if repo and repo.work_tree else (repo.git_dir if repo else "/")
    return argv, cwd


# Read at most this much of a streamed command's output at once, and ask for a pipe this
# large (Linux allows unprivileged processes up to 1 MiB): git writes ahead while we parse.
_BATCH = 1 << 20


def run_z(args: Sequence[str], repo: Repo) -> Generator[list[str], None, None]:
    """Run one hardened git command whose output is NUL-separated (-z) and yield its
    tokens in batches as git writes them, each batch whole tokens.

    For output of 100k paths: parsing each batch while git writes the next puts the two
    cores side by side (the whole output first, then the parse, took 175 ms where this
    takes 120). GitError, with git's last word, after the last batch if git failed; a
    caller that stops early leaves no git behind."""
    argv, cwd = _command(args, repo, cwd=None, literal=True)
    try:
        proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=environment(repo))
    except OSError as exc:
        raise GitError(f"could not start git ({exc.strerror}): check that {argv[0]} works") from exc
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    with proc:  # closes both pipes; waits for git
        try:
            try:
                fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, _BATCH)  # Linux only
            except (OSError, AttributeError):
                pass  # above the system's pipe-max-size, or elsewhere: git waits on us more often, that is all
            poll, errors, tail = select.poll(), bytearray(), b""
            poll.register(out, select.POLLIN)
            poll.register(err, select.POLLIN)
            reading = 2
            while reading:
                for fd, _ in poll.poll():
                    chunk = os.read(fd, _BATCH)
                    if not chunk:
                        poll.unregister(fd)
                        reading -= 1
                    elif fd == err:
                        errors += chunk
                    else:
                        # Cut after the last NUL: UTF-8 never holds a zero byte inside a character,
                        # so each piece decodes as the whole output would.
                        data = tail + chunk
                        cut = data.rfind(b"\0")
                        if cut >= 0:
                            yield data[:cut].decode("utf-8", "surrogateescape").split("\0")
                        tail = data[cut + 1:]
            code = proc.wait()
        finally:
            if proc.returncode is None:  # the caller stopped reading (or failed) part way
                proc.kill()
    if tail:
        yield [tail.decode("utf-8", "surrogateescape")]
    if code != 0:
        raise GitError(describe(tuple(args), code, bytes(errors)))


def _with_person_config(env: dict[str, str]) -> dict[str, str]:
    for name in ("HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL", "GIT_CONFIG_NOSYSTEM", "GIT_CONFIG_SYSTEM"):
        if name in os.environ:
            env[name] = os.environ[name]
        else:
            env.pop(name, None)
    return env


def is_oid(text: str | bytes) -> bool:
    """A full object id as git prints it: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits."""
    digits = text.encode() if isinstance(text, str) else text
    return len(digits) in (40, 64) and not digits.strip(b"0123456789abcdef")


def describe_failure(result: Result) -> str:
    return describe(result.args, result.returncode, result.stderr)


# --- discovery (runs on the person's repository, before any agent exists) -----------------


class Discovered(NamedTuple):
    git_dir: Path
    common_dir: Path
    toplevel: Path

    def repo(self) -> "Repo":
        return Repo(self.git_dir, self.common_dir, self.toplevel)


_WHERE = ("rev-parse", "--is-bare-repository", "--absolute-git-dir", "--git-common-dir")


def discover(path: Path) -> Discovered:
    """Find the repository that holds `path`; refuse what exec cannot use."""
    if not path.is_dir():
        raise RepoError(f"{path} is not a directory: run ccm-guard inside a git repository or pass --repo")
    query: tuple[str, ...] = (*_WHERE, "--show-toplevel")
    res = run(query, cwd=path, check=False)
    if res.returncode != 0:  # no work tree, or no repository at all: ask again to tell which
        query = _WHERE
        res = run(query, cwd=path, check=False)
    if res.returncode != 0:
        raise NotARepository(f"{path} is not in a git repository: run `git init` first or pass --repo PATH")
    lines = res.lines()
    if len(lines) != len(query) - 1:  # one line per question
        raise RepoError(f"{path}: the repository's path holds a line break, which git's answers cannot "
                        "carry: move the repository to a path without one")
    return _discovered(path, *lines)


def discover_commits(path: Path, *revs: str) -> tuple[Discovered, list[str]] | None:
    """discover(path) and the commit each of `revs` names there, in one git process, where
    it answers all plainly; None otherwise (no repository, no such commit, an option-like
    or ambiguous rev, a range): the caller asks again one at a time, which says what is
    wrong."""
    if any(rev.startswith("-") for rev in revs) or not path.is_dir():
        return None
    res = run([*_WHERE, "--show-toplevel", *(f"{rev}^{{commit}}" for rev in revs)], cwd=path, check=False)
    lines = res.lines()
    ids = lines[4:]
    if res.returncode != 0 or len(ids) != len(revs) or lines[0] != "false" or not all(map(is_oid, ids)):
        return None
    return _discovered(path, *lines[:4]), ids


def _discovered(path: Path, bare: str, git_dir: str, common: str, *top: str) -> Discovered:
    if bare == "true":
        raise RepoError(
            f"{git_dir} is a bare repository: ccm-guard needs a checkout; clone it first "
            "(git clone BARE checkout) and run there"
        )
    common_path = Path(common)
    if not common_path.is_absolute():
        common_path = Path(path, common_path)
    if not top:
        raise RepoError(f"{path} is inside a git directory, not a work tree: cd into the checkout")
    return Discovered(
        git_dir=Path(os.path.realpath(git_dir)),
        common_dir=Path(os.path.realpath(common_path)),
        toplevel=Path(os.path.realpath(top[0])),
    )
