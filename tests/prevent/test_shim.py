"""The git shim (shims/git) against real git in real temporary repositories.

Each test builds a repository with `main` and a linked worktree on `ccm/t1`, puts a
directory holding a `git` symlink to the shim first on PATH and runs `git ...` in the
worktree. Refused commands must exit 1 with one `ccm-guard: refused:` line, leave every
file of the repository as it was and log a JSON line; allowed commands must behave
byte for byte like the real git (same stdout, stderr and exit code), in the same
repository when they only read, in an identical twin repository when they write.

Decisions of the shim that these tests pin down (see the header of shims/git):
- `ls-remote`, `remote show NAME` (both contact the remote) and `credential` are
  refused as `remote`; `remote -v`, `remote get-url`, `remote show -n` are allowed.
- `worktree list` is allowed, every other `worktree` subcommand refused.
- `checkout WORD` without `--` is decided as git decides it: a revision or a
  remote-tracking branch `<remote>/WORD` is a switch (refused), a tracked path that is
  neither is a file restore (allowed), anything else is refused.
- `-c` that only switches something off (the pager, fsmonitor, protocols, an empty
  program) passes everywhere; hooks off (`core.hooksPath=/dev/null` or empty,
  `hook.<name>.enabled=false`) passes on reads and is `no-verify` elsewhere.
- Configuration in the environment (GIT_CONFIG_COUNT pairs, GIT_CONFIG_PARAMETERS) is
  judged pair by pair like `-c`; hooks off from there is neutralised on writes (the
  task's hooks run) instead of refused; a count or text git would reject is `redirect`.
- GIT_CONFIG_GLOBAL, GIT_CONFIG_NOSYSTEM, GIT_CONFIG_SYSTEM=/dev/null and
  GIT_CONFIG_COUNT=0 pass; the other redirecting variables refuse every command.
- Tag creation is a ref write; `repack -d` is `gc`; `stash branch` and `bisect` are
  switches; `stash clear`/`drop` are ref writes (refs/stash is shared); `rebase` is allowed only onto a base inside HEAD's history.
- Abbreviated long options are rejected by git itself under the shim
  (GIT_TEST_DISALLOW_ABBREVIATED_OPTIONS=1), so `--no-veri` cannot slip through.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from ccm_guard.prevent import sandbox

SHIM = ROOT / "shims" / "git"
needs_landlock = pytest.mark.skipif(sandbox.abi() == 0, reason=f"no Landlock here: {sandbox.describe()}")
REAL_GIT = os.path.realpath(shutil.which("git") or "/usr/bin/git")
BRANCH = "ccm/t1"
TIMEOUT = 20

IDENTITY = {
    "GIT_AUTHOR_NAME": "Test Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_AUTHOR_DATE": "2024-01-02T03:04:05+00:00",
    "GIT_COMMITTER_NAME": "Test Committer",
    "GIT_COMMITTER_EMAIL": "committer@example.com",
    "GIT_COMMITTER_DATE": "2024-01-02T03:04:05+00:00",
}


@dataclass
class Repo:
    root: Path  # holds main/ and wt/
    main: Path  # the person's checkout, on main
    wt: Path  # the linked worktree, on ccm/t1
    base: str  # the commit ccm/t1 started from
    main_only: str  # a commit on main, not in the task's history
    env: dict[str, str]  # for the shim and the real git alike
    log: Path  # CCM_GUARD_LOG
    admin: Path  # the linked worktree's admin dir


def _base_env(home: Path, templates: Path) -> dict[str, str]:
    """A clean environment: nothing inherited from the caller's git setup."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "GIT_TEMPLATE_DIR": str(templates),
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_EDITOR": "true",
        "LANG": "C",
        "LC_ALL": "C",
        "TZ": "UTC",
        **IDENTITY,
    }


def _setup_git(env: dict[str, str], cwd: Path, *args: str) -> str:
    """Real git for building fixtures, with global and system config switched off."""
    full = dict(env, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1")
    out = subprocess.run([REAL_GIT, *args], cwd=cwd, env=full, check=True,
                         capture_output=True, timeout=TIMEOUT)
    return out.stdout.decode().strip()


def make_repo(root: Path) -> Repo:
    """main: initial, main-only.  ccm/t1 (linked worktree) from initial: task one, two."""
    root.mkdir(parents=True)
    home = root / "home"
    home.mkdir()
    templates = root / "templates"
    templates.mkdir()
    env = _base_env(home, templates)
    main = root / "main"
    wt = root / "wt"
    main.mkdir()
    _setup_git(env, main, "init", "-q", "-b", "main")
    _setup_git(env, main, "config", "user.name", "Repo User")
    _setup_git(env, main, "config", "user.email", "repo@example.com")
    (main / "a.txt").write_text("alpha\n")
    (main / "dir").mkdir()
    (main / "dir" / "b.txt").write_text("beta\n")
    (main / "with space.txt").write_text("space\n")
    _setup_git(env, main, "add", "-A")
    _setup_git(env, main, "commit", "-q", "-m", "initial")
    base = _setup_git(env, main, "rev-parse", "HEAD")
    (main / "main-only.txt").write_text("main only\n")
    _setup_git(env, main, "add", "-A")
    _setup_git(env, main, "commit", "-q", "-m", "main only")
    main_only = _setup_git(env, main, "rev-parse", "HEAD")
    _setup_git(env, main, "tag", "v1", base)
    _setup_git(env, main, "worktree", "add", "-q", "-b", BRANCH, str(wt), base)
    (wt / "t.txt").write_text("task\n")
    _setup_git(env, wt, "add", "t.txt")
    _setup_git(env, wt, "commit", "-q", "-m", "task one")
    (wt / "a.txt").write_text("alpha\nchanged by the task\n")
    _setup_git(env, wt, "commit", "-q", "-am", "task two")

    bindir = root / "bin"
    bindir.mkdir()
    (bindir / "git").symlink_to(SHIM)
    log = root / "refusals.jsonl"
    admin = main / ".git" / "worktrees" / "wt"
    env = dict(env, PATH=f"{bindir}{os.pathsep}{env['PATH']}",
               CCM_GUARD_REAL_GIT=REAL_GIT, CCM_GUARD_BRANCH=BRANCH, CCM_GUARD_LOG=str(log))
    return Repo(root, main, wt, base, main_only, env, log, admin)


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return make_repo(tmp_path / "a")


@pytest.fixture
def twins(tmp_path: Path) -> tuple[Repo, Repo]:
    """Two repositories with identical content and commit ids."""
    return make_repo(tmp_path / "a"), make_repo(tmp_path / "b")


def shim(r: Repo, *args: str, env: dict[str, str] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    """`git ARGS` found on PATH, i.e. the shim."""
    return subprocess.run(["git", *args], cwd=cwd or r.wt, env=env or r.env,
                          capture_output=True, timeout=TIMEOUT)


def real(r: Repo, *args: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([REAL_GIT, *args], cwd=cwd or r.wt, env=env or r.env,
                          capture_output=True, timeout=TIMEOUT)


def snapshot(r: Repo) -> dict[str, tuple[int, bytes]]:
    """Every file and symlink of both checkouts and the git directory."""
    files: dict[str, tuple[int, bytes]] = {}
    for top in (r.main, r.wt):
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            for name in sorted(dirnames + filenames):
                p = Path(dirpath) / name
                st = p.lstat()
                if stat.S_ISLNK(st.st_mode):
                    data = os.readlink(p).encode()
                elif stat.S_ISREG(st.st_mode):
                    data = p.read_bytes()
                else:
                    data = b""
                files[str(p.relative_to(r.root))] = (st.st_mode, data)
    return files


def log_lines(r: Repo) -> list[dict[str, Any]]:
    if not r.log.exists():
        return []
    return [json.loads(line) for line in r.log.read_text(encoding="utf-8").splitlines()]


def assert_refused(r: Repo, args: list[str], op: str,
                   env: dict[str, str] | None = None) -> bytes:
    before = snapshot(r)
    logged = len(log_lines(r))
    res = shim(r, *args, env=env)
    assert res.returncode == 1, (res.returncode, res.stderr)
    assert res.stderr.startswith(b"ccm-guard: refused: "), res.stderr
    assert res.stderr.count(b"\n") == 1 and res.stderr.endswith(b"\n"), res.stderr
    assert res.stdout == b""
    assert snapshot(r) == before, "the repository changed"
    entries = log_lines(r)
    assert len(entries) == logged + 1
    entry = entries[-1]
    assert entry["op"] == op
    assert entry["argv"] == list(args)
    assert isinstance(entry["ts"], int) and entry["ts"] > 1_600_000_000
    assert entry["reason"] and "\n" not in entry["reason"]
    assert res.stderr.decode() == f"ccm-guard: refused: {entry['reason']}\n"
    return res.stderr


def assert_same(a: subprocess.CompletedProcess[bytes], b: subprocess.CompletedProcess[bytes]) -> None:
    assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr)


# --- refused ---------------------------------------------------------------

MAIN_ONLY = "<main-only>"  # replaced by the commit id in the test

REFUSED = [
    # dangerous -c / --config-env, with global options in front
    (["-C", ".", "-c", "core.hooksPath=/tmp/x", "commit", "-m", "x"], "dangerous-config"),
    (["-c", "CORE.HOOKSPATH=x", "status"], "dangerous-config"),
    (["-c", "core.pager=less", "log"], "dangerous-config"),
    (["-c", "core.pager", "log"], "dangerous-config"),
    (["-c", "pager.log=less", "log"], "dangerous-config"),
    (["-c", "pager.log", "log"], "dangerous-config"),  # true: the pager on
    (["-c", "core.fsmonitor", "status"], "dangerous-config"),  # true: the daemon
    (["-c", "core.fsmonitor=/tmp/x", "status"], "dangerous-config"),
    # hooks off: only exactly /dev/null, and only on reads
    (["-c", "core.hooksPath=/dev/null/../x", "status"], "dangerous-config"),
    (["-c", "core.hooksPath=/dev/null/", "status"], "dangerous-config"),
    (["-c", "core.hooksPath=", "commit", "--allow-empty", "-m", "x"], "no-verify"),
    (["-c", "hook.pre-commit.enabled=false", "commit", "--allow-empty", "-m", "x"], "no-verify"),
    (["-c", "Hook.Pre-Commit.Enabled=OFF", "add", "a.txt"], "no-verify"),
    (["-c", "hook.pre-commit.enabled=true", "status"], "dangerous-config"),
    (["-c", "hook.pre-commit.command=touch /tmp/x", "status"], "dangerous-config"),
    (["-c", "protocol.ext.allow=always", "status"], "dangerous-config"),
    (["-c", "protocol.allow=user", "status"], "dangerous-config"),
    (["-c", "submodule.recurse=true", "status"], "dangerous-config"),
    (["-c", "submodule.x.update=!touch /tmp/x", "status"], "dangerous-config"),
    (["-c", "help.autocorrect=1", "status"], "dangerous-config"),
    (["-c", "help.autocorrect=immediate", "status"], "dangerous-config"),
    (["-c", "credential.helper=!touch /tmp/x", "status"], "dangerous-config"),
    (["-c", "core.askPass=/tmp/x", "status"], "dangerous-config"),
    (["-c", "core.editor=vi", "status"], "dangerous-config"),
    (["-c", "diff.external", "diff"], "dangerous-config"),  # true
    (["-c", "alias.ST=!touch /tmp/pwned", "st"], "dangerous-config"),
    (["-c", "alias.st.command=!touch /tmp/pwned", "st"], "dangerous-config"),
    (["-c", "core.alternateRefsCommand=touch /tmp/x", "log", "--alternate-refs"], "dangerous-config"),
    (["-c", "core.alternateRefsCommand=touch /tmp/x", "rev-list", "--stdin"], "dangerous-config"),
    (["-c", "core.alternateRefsCommand=touch /tmp/x", "fetch"], "dangerous-config"),
    (["-c", "core.alternateRefsCommand=touch /tmp/x", "no-such-alias"], "dangerous-config"),
    (["--config-env=diff.a=b.textconv=HOME", "log", "-p"], "dangerous-config"),  # git splits at the last =
    (["-c", "core.hooksPath", "status"], "dangerous-config"),
    (["-c", "core.hooksPath=/dev/null", "-c", "core.hooksPath=/tmp/x", "status"], "dangerous-config"),
    (["-c", "core.hooksPath=/tmp/x", "-c", "core.hooksPath=/dev/null", "status"], "dangerous-config"),
    (["--config-env=core.hooksPath=NULLVAR", "status"], "dangerous-config"),
    (["--config-env", "core.pager=CATVAR", "log"], "dangerous-config"),
    (["-c", "core.hooksPath=/dev/null", "commit", "--allow-empty", "-m", "x"], "no-verify"),
    (["-c", "CORE.HOOKSPATH=/dev/null", "-C", ".", "commit", "-am", "x"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "add", "a.txt"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "checkout", "--", "a.txt"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "checkout", BRANCH], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "restore", "a.txt"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "reset", "--hard"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "cherry-pick", "--abort"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "rebase", "HEAD~1"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "stash"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "stash", "pop"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "branch", "-u", "main"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "update-ref", "refs/heads/ccm/t1", "HEAD~1"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "gc"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "no-such-alias"], "no-verify"),
    (["-c", "core.hooksPath=/dev/null", "merge", "main"], "merge"),  # the handler's reason first
    (["-c", "Diff.MyDriver.TextConv=cat", "log", "-p"], "dangerous-config"),
    (["-c", "alias.st=!touch /tmp/pwned", "st"], "dangerous-config"),
    (["-c", "includeIf.gitdir:/x/.path=/tmp/evil", "status"], "dangerous-config"),
    (["--config-env=core.fsmonitor=HOME", "status"], "dangerous-config"),
    (["--config-env", "filter.x.clean=HOME", "add", "a.txt"], "dangerous-config"),
    (["--no-pager", "-c", "core.sshCommand=evil", "status"], "dangerous-config"),
    # pointing git elsewhere
    (["--git-dir=../x/.git", "log"], "redirect"),
    (["--git-dir", "../x/.git", "log"], "redirect"),
    (["--work-tree=..", "status"], "redirect"),
    (["--namespace", "x", "log"], "redirect"),
    (["--bare", "log"], "redirect"),
    (["--exec-path=/tmp", "status"], "redirect"),
    # hooks skipped
    (["commit", "-anm", "msg"], "no-verify"),
    (["commit", "--no-verify", "-m", "x"], "no-verify"),
    (["commit", "-n", "-m", "x"], "no-verify"),
    (["commit", "-qn", "--allow-empty", "-m", "x"], "no-verify"),
    (["commit", "-m", 'line one\nline "two" \\ end\ttab', "--no-verify"], "no-verify"),
    (["am", "--no-verify", "x.patch"], "no-verify"),
    (["merge", "--no-verify", "main"], "no-verify"),
    # remotes
    (["push"], "remote"),
    (["push", "origin", "HEAD"], "remote"),
    (["fetch"], "remote"),
    (["pull"], "remote"),
    (["clone", ".", "/tmp/never"], "remote"),
    (["ls-remote", "."], "remote"),
    (["remote", "add", "x", "../x"], "remote"),
    (["remote", "-v", "set-url", "origin", "x"], "remote"),
    (["remote", "show", "origin"], "remote"),
    (["credential", "fill"], "remote"),
    # leaving the task branch
    (["checkout", "main"], "switch"),
    (["checkout", "-b", "other"], "switch"),
    (["checkout", "-qb", "other", "main"], "switch"),
    (["checkout", "--detach"], "switch"),
    (["checkout", "-"], "switch"),
    (["checkout", MAIN_ONLY], "switch"),
    (["checkout", "nosuch.txt"], "switch"),  # neither a revision nor a tracked path
    (["checkout", "main-only.txt"], "switch"),  # a file of main, not tracked here
    (["checkout", "v1"], "switch"),  # a tag: detaches
    (["checkout", "HEAD~1"], "switch"),
    (["checkout", "@"], "switch"),
    (["checkout", "HEAD:a.txt"], "switch"),
    (["checkout", "main...HEAD"], "switch"),  # the merge base
    (["checkout", "a.txt", "--"], "switch"),  # `WORD --` is always a revision
    (["checkout", "-q", "main"], "switch"),
    (["-C", "dir", "checkout", "main"], "switch"),
    (["checkout", "--end-of-options", "-x"], "switch"),
    (["--no-pager", "checkout", "main"], "switch"),
    (["switch", "-c", "x"], "switch"),
    (["switch", "main"], "switch"),
    (["switch", "--detach", "HEAD"], "switch"),
    (["stash", "branch", "x"], "switch"),
    (["stash", "-q", "branch", "x"], "switch"),
    (["bisect", "start"], "switch"),
    (["rebase", "main", "main"], "switch"),
    # refs other than the task's
    (["branch", "-D", "main"], "ref-write"),
    (["branch", "-f", "main", "HEAD"], "ref-write"),
    (["branch", "newbranch"], "ref-write"),
    (["branch", "-m", "renamed"], "ref-write"),
    (["branch", "--delete", "--force", "main"], "ref-write"),
    (["branch", "-dr", "origin/main"], "ref-write"),
    (["tag", "-d", "v1"], "ref-write"),
    (["tag", "v2"], "ref-write"),
    (["stash", "clear"], "ref-write"),
    (["stash", "drop"], "ref-write"),
    (["update-ref", "refs/heads/main", "HEAD"], "ref-write"),
    (["update-ref", "-d", "refs/heads/main"], "ref-write"),
    (["update-ref", "--stdin"], "ref-write"),
    (["symbolic-ref", "HEAD", "refs/heads/main"], "ref-write"),
    (["rebase", "--update-refs", "HEAD~1"], "ref-write"),
    # moving the task branch out of its history
    (["reset", "--hard", MAIN_ONLY], "reset-outside"),
    (["reset", "--soft", "main"], "reset-outside"),
    (["reset", "main", "--"], "reset-outside"),
    (["-C", "dir", "reset", "--keep", "main"], "reset-outside"),
    (["update-ref", "refs/heads/ccm/t1", MAIN_ONLY], "reset-outside"),
    (["checkout", "-B", "ccm/t1", "main"], "reset-outside"),
    # deleting history
    (["reflog", "expire", "--all"], "gc"),
    (["reflog", "delete", "HEAD@{1}"], "gc"),
    (["gc", "--prune=now"], "gc"),
    (["gc", "--prune=all"], "gc"),
    (["prune"], "gc"),
    (["repack", "-ad"], "gc"),
    # configuration
    (["config", "core.hooksPath", "x"], "config-write"),
    (["config", "--worktree", "core.hooksPath", "x"], "config-write"),
    (["config", "--global", "user.name", "x"], "config-write"),
    (["config", "--unset", "user.name"], "config-write"),
    (["config", "-e"], "config-write"),
    (["config", "set", "user.name", "x"], "config-write"),
    (["sparse-checkout", "set", "dir"], "config-write"),
    # worktrees, submodules, merges
    (["worktree", "add", "../y"], "worktree"),
    (["worktree", "remove", "--force", "."], "worktree"),
    (["worktree", "prune"], "worktree"),
    (["submodule", "add", "../x", "sub"], "submodule"),
    (["submodule", "status"], "submodule"),
    (["merge", "main"], "merge"),
    (["merge", "-m", "--no-verify", "main"], "merge"),
    (["rebase", "main"], "merge"),
    (["rebase", "--onto", "main", "HEAD~1"], "merge"),
    (["rebase", "-i", "--root"], "merge"),
    (["cherry-pick", "main"], "merge"),
]


def _ids(case: tuple[list[str], str]) -> str:
    args, op = case
    return " ".join(args).replace("\n", "\\n")[:60] + f" [{op}]"


@pytest.mark.parametrize("case", REFUSED, ids=[_ids(c) for c in REFUSED])
def test_refused(repo: Repo, case: tuple[list[str], str]) -> None:
    args, op = case
    args = [repo.main_only if a == MAIN_ONLY else a for a in args]
    assert_refused(repo, args, op)


@pytest.mark.parametrize("var,value", [
    ("GIT_DIR", "../main/.git"),
    ("GIT_WORK_TREE", ".."),
    ("GIT_INDEX_FILE", "/tmp/index"),
    ("GIT_OBJECT_DIRECTORY", "/tmp/objects"),
    ("GIT_EXEC_PATH", "/tmp"),
    ("GIT_COMMON_DIR", "../main/.git"),
    ("GIT_ALTERNATE_OBJECT_DIRECTORIES", "/tmp/objects"),
    ("GIT_CONFIG", "/tmp/config"),
    ("GIT_NAMESPACE", "x"),
    ("GIT_SHALLOW_FILE", "/tmp/shallow"),
    ("GIT_CONFIG_SYSTEM", "/tmp/evil"),
    ("GIT_CONFIG_SYSTEM", ""),
])
def test_refused_redirect_environment(repo: Repo, var: str, value: str) -> None:
    # Accepted variables beside it are not named.
    env = dict(repo.env, GIT_CONFIG_GLOBAL="/dev/null", GIT_CONFIG_NOSYSTEM="1", **{var: value})
    err = assert_refused(repo, ["status"], "redirect", env=env)
    assert err.startswith(f"ccm-guard: refused: {var} set: ".encode()), err
    assert b"GIT_CONFIG_GLOBAL set" not in err


def test_refused_redirect_environment_names_every_variable(repo: Repo) -> None:
    env = dict(repo.env, GIT_DIR=".git", GIT_CONFIG_SYSTEM="/etc/x", GIT_CONFIG_COUNT="2",
               GIT_CONFIG_GLOBAL="/dev/null")
    err = assert_refused(repo, ["log"], "redirect", env=env)
    # The config pairs are judged on their own (never reached here).
    assert err.startswith(b"ccm-guard: refused: GIT_DIR GIT_CONFIG_SYSTEM set: ")


@pytest.mark.parametrize("extra", [
    {"GIT_CONFIG_GLOBAL": "<global>"},
    {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"},
    {"GIT_CONFIG_SYSTEM": "/dev/null"},
    {"GIT_CONFIG_COUNT": "0", "GIT_CONFIG_KEY_0": "core.hooksPath", "GIT_CONFIG_VALUE_0": "/tmp/x"},
    {"GIT_CONFIG_COUNT": ""},
    {"XDG_CONFIG_HOME": "<xdg>", "GIT_AUTHOR_NAME": "Someone", "GIT_COMMITTER_EMAIL": "c@example.com"},
], ids=lambda e: " ".join(e))
def test_allowed_config_environment(repo: Repo, extra: dict[str, str]) -> None:
    """The person's config choice passes through: same answer as the real git."""
    glob = repo.root / "global.gitconfig"
    glob.write_text("[user]\n\tname = From Global\n[log]\n\tabbrevCommit = true\n")
    xdg = repo.root / "xdg"
    (xdg / "git").mkdir(parents=True)
    (xdg / "git" / "config").write_text("[user]\n\temail = xdg@example.com\n")
    env = dict(repo.env, **{k: v.replace("<global>", str(glob)).replace("<xdg>", str(xdg))
                            for k, v in extra.items()})
    for args in (["status", "--short"], ["config", "--get", "user.name"], ["log", "-1"],
                 ["-c", "color.ui=never", "var", "GIT_AUTHOR_IDENT"]):
        assert_same(shim(repo, *args, env=env), real(repo, *args, env=env))
    assert not repo.log.exists()


# --- configuration in the environment, as real agents pass it ---------------------------

HOOK_NAMES = (
    "applypatch-msg pre-applypatch post-applypatch pre-commit pre-merge-commit "
    "prepare-commit-msg commit-msg post-commit pre-rebase post-checkout post-merge pre-push "
    "pre-receive update proc-receive post-receive post-update reference-transaction "
    "push-to-checkout pre-auto-gc post-rewrite sendemail-validate fsmonitor-watchman "
    "p4-changelist p4-prepare-changelist p4-post-changelist p4-pre-submit post-index-change"
).split()
# Claude Code 2.1.x, for its own git calls (seen through a `git` on PATH that dumps its
# environment): 39 pairs, the same ones again as -c, and GIT_CONFIG_PARAMETERS.
CLAUDE_PAIRS = [
    ("core.fsmonitor", ""), ("core.hooksPath", "/dev/null"), ("core.askPass", ""),
    ("protocol.ext.allow", "never"),
    ("core.alternateRefsCommand",
     "f() { git --git-dir=\"$1\" for-each-ref --format='%(objectname)'; }; f"),
    ("submodule.recurse", "false"), ("log.showSignature", "false"), ("format.pretty", "medium"),
    ("gc.auto", "0"), ("maintenance.auto", "false"), ("diff.autoRefreshIndex", "false"),
    *[(f"hook.{name}.enabled", "false") for name in HOOK_NAMES],
]
assert len(CLAUDE_PAIRS) == 39
CLAUDE_C = [w for k, v in [*CLAUDE_PAIRS[2:], ("core.hooksPath", "/dev/null"),
                           ("core.fsmonitor", ""), ("safe.bareRepository", "explicit"),
                           ("protocol.file.allow", "never")] for w in ("-c", f"{k}={v}")]


def pairs_env(pairs: list[tuple[str, str]]) -> dict[str, str]:
    env = {"GIT_CONFIG_COUNT": str(len(pairs))}
    for i, (k, v) in enumerate(pairs):
        env[f"GIT_CONFIG_KEY_{i}"], env[f"GIT_CONFIG_VALUE_{i}"] = k, v
    return env


def sq(text: str) -> str:
    """git's sq_quote_buf: ' and ! leave the quotes."""
    return "'" + text.replace("'", "'\\''").replace("!", "'\\!'") + "'"


CLAUDE_ENV = {
    **pairs_env(CLAUDE_PAIRS),
    "GIT_CONFIG_PARAMETERS": " ".join(f"{sq(k)}={sq(v)}" for k, v in [
        ("alias.remote-none", "version"), ("alias.remote-none.command", "version"),
        ("alias.remote-/.command", "version"), ("fetch.bundleURI", ""), ("help.autocorrect", "0")]),
    "GIT_CONFIG_NOSYSTEM": "1", "GIT_SSH_COMMAND": "false", "GIT_PROXY_COMMAND": "",
    "GIT_TERMINAL_PROMPT": "0", "GIT_NO_REPLACE_OBJECTS": "1", "GIT_ALLOW_PROTOCOL": "/",
    "GIT_LFS_SKIP_SMUDGE": "1", "GIT_NO_LAZY_FETCH": "1", "GIT_TRACE2": "0",
}
CLAUDE_READS = [
    [*CLAUDE_C, "config", "--local", "--includes", "-z", "--list"],
    [*CLAUDE_C, "config", "--worktree", "--includes", "-z", "--list"],
    [*CLAUDE_C, "-c", "core.ignorecase=false", "rev-parse", "--is-inside-work-tree", "--show-cdup"],
    [*CLAUDE_C, "config", "user.name"],
    [*CLAUDE_C, "--no-optional-locks", "log", "--oneline", "-n", "5"],
    [*CLAUDE_C, "--no-optional-locks", "status", "--short", "--ignore-submodules=dirty"],
    [*CLAUDE_C, "remote", "get-url", "origin"],
    [*CLAUDE_C, "remote"],
    ["-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=", "-c", "safe.bareRepository=explicit",
     "-c", "protocol.file.allow=never", "ls-files", "--error-unmatch", "--",
     ":(icase).claude/settings.local.json"],
]
# Gemini CLI 0.61, for every command of its shell tool.
GEMINI_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_SYSTEM": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
    **pairs_env([("credential.helper", ""), ("core.fsmonitor", ""), ("core.hooksPath", ""),
                 ("core.sshCommand", ""), ("core.pager", "cat"), ("core.editor", ""),
                 ("sequence.editor", ""), ("diff.external", "")]),
    "GIT_ASKPASS": "", "GIT_PAGER": "cat", "PAGER": "cat", "GIT_TERMINAL_PROMPT": "0",
}


@pytest.mark.parametrize("args", CLAUDE_READS, ids=lambda a: " ".join(a[a.index("--list") - 3:] if "--list" in a else a[-4:]))
def test_claude_code_own_reads_pass(repo: Repo, args: list[str]) -> None:
    env = dict(repo.env, **CLAUDE_ENV)
    assert_same(shim(repo, *args, env=env), real(repo, *args, env=env))
    assert not repo.log.exists()


def test_claude_code_env_keeps_remote_commands_refused(repo: Repo) -> None:
    env = dict(repo.env, **CLAUDE_ENV)
    assert_refused(repo, ["remote", "add", "x", "../x"], "remote", env=env)
    # git would run core.alternateRefsCommand there: refused before the remote check.
    assert_refused(repo, ["ls-remote", "."], "dangerous-config", env=env)
    assert_refused(repo, ["fetch", "origin"], "dangerous-config", env=env)
    assert_refused(repo, ["push"], "dangerous-config", env=env)


def _install_hook(r: Repo) -> Path:
    """A pre-commit hook (in the common dir, as for every worktree) that records that it
    ran and the configuration variables it saw."""
    marker = r.root / "hook-ran"
    hook = r.main / ".git" / "hooks" / "pre-commit"
    hook.parent.mkdir(exist_ok=True)
    hook.write_text(f"#!/bin/sh\n{{ echo ran; printf '%s\\n' \"${{GIT_CONFIG_PARAMETERS-unset}}\";"
                    f" env | grep '^GIT_CONFIG_KEY_' | sort; }} >> '{marker}'\n")
    hook.chmod(0o755)
    return marker


def test_gemini_env_adds_and_commits_with_the_tasks_hooks(twins: tuple[Repo, Repo]) -> None:
    """Gemini's empty core.hooksPath would skip the hooks: on a write it is neutralised,
    silently (no refusal logged), and the task's pre-commit hook runs."""
    a, b = twins
    marker_a, marker_b = _install_hook(a), _install_hook(b)
    env_a, env_b = dict(a.env, **GEMINI_ENV), dict(b.env, **GEMINI_ENV)
    for r in (a, b):
        (r.wt / "hello.txt").write_text("hello\n")
    assert_same(shim(a, "add", "hello.txt", env=env_a), real(b, "add", "hello.txt", env=env_b))
    assert shim(a, "commit", "-q", "-m", "Add hello", env=env_a).returncode == 0
    assert marker_a.read_text().splitlines() == [
        "ran", "unset", *sorted(f"GIT_CONFIG_KEY_{i}={k}" for i, k in enumerate(
            ["credential.helper", "core.fsmonitor", "ccm-guard.neutralised", "core.sshCommand",
             "core.pager", "core.editor", "sequence.editor", "diff.external"]))]
    assert real(a, "log", "-1", "--format=%s").stdout == b"Add hello\n"
    # The real git with the same environment skips the hook.
    assert real(b, "commit", "-q", "-m", "Add hello", env=env_b).returncode == 0
    assert not marker_b.exists()
    # Reads keep the hooks off, byte for byte.
    for args in (["rev-parse", "--show-toplevel"], ["rev-parse", "--git-common-dir"],
                 ["status", "--porcelain"], ["log", "-1", "--format=subject:%s"],
                 ["diff", "HEAD~1"]):  # diff.external= : git 2.39 fails to run ''
        assert_same(shim(a, *args, env=env_a), real(a, *args, env=env_a))
    assert not a.log.exists()


@pytest.mark.parametrize("hooks_off", [
    {"GIT_CONFIG_PARAMETERS": "'core.hookspath'='/dev/null' 'user.name'='O'\\''Brien'\\!''"},
    {"GIT_CONFIG_PARAMETERS": "'user.name=O'\\''Brien'\\!'' 'hook.pre-commit.enabled'='false' 'core.hooksPath='"},
    {**pairs_env([("user.name", "O'Brien!"), ("Core.HooksPath", "/dev/null")])},
], ids=["params new style", "params old style", "count"])
def test_env_hooks_off_on_a_commit_is_neutralised(repo: Repo, hooks_off: dict[str, str]) -> None:
    marker = _install_hook(repo)
    env = dict(repo.env, **hooks_off)
    res = shim(repo, "commit", "--allow-empty", "-q", "-m", "x", env=env)
    assert res.returncode == 0, res.stderr
    lines = marker.read_text().splitlines()
    assert lines[0] == "ran"
    if "GIT_CONFIG_PARAMETERS" in hooks_off:  # rebuilt without the item, quoting intact
        assert lines[1] in ("'user.name'='O'\\''Brien'\\!'' ", "'user.name=O'\\''Brien'\\!'' ")
    else:
        assert lines[2:] == ["GIT_CONFIG_KEY_0=user.name", "GIT_CONFIG_KEY_1=ccm-guard.neutralised"]
    assert real(repo, "config", "user.name", env=env).stdout == b"O'Brien!\n"
    assert not repo.log.exists()
    # A role that allows skipping hooks keeps them off.
    marker.unlink()
    env["CCM_GUARD_ALLOW"] = "no-verify"
    assert shim(repo, "commit", "--allow-empty", "-q", "-m", "y", env=env).returncode == 0
    assert not marker.exists()


ENV_PAIRS_REFUSED = [
    # (key, value, args): each pair runs a program or steers git
    ("core.sshCommand", "evil", ["status"]),
    ("diff.external", "touch /tmp/pwned", ["diff"]),
    ("filter.x.clean", "touch /tmp/pwned", ["add", "a.txt"]),
    ("include.path", "/tmp/evil.gitconfig", ["status"]),
    ("includeIf.gitdir:/.path", "/tmp/evil.gitconfig", ["status"]),
    ("core.pager", "less", ["log", "-1"]),  # the pager on: a program
    ("pager.log", "true", ["log", "-1"]),
    ("core.hooksPath", "/tmp/hooks", ["status"]),
    ("core.hooksPath", "/dev/null/", ["status"]),
    ("alias.st", "!touch /tmp/pwned", ["st"]),
    ("ALIAS.St", "!touch /tmp/pwned", ["st"]),
    ("alias.st.command", "!touch /tmp/pwned", ["st"]),
    ("protocol.ext.allow", "always", ["status"]),
    ("help.autocorrect", "immediate", ["status"]),
    ("credential.helper", "!touch /tmp/pwned", ["status"]),
    ("core.editor", "touch /tmp/pwned", ["commit", "--allow-empty"]),
    ("hook.pre-commit.command", "touch /tmp/pwned", ["status"]),
    ("core.alternateRefsCommand", "touch /tmp/pwned", ["log", "--alternate-refs"]),
    ("Diff.MyDriver.TextConv", "cat", ["log", "-p"]),
]


def _pair_id(c: tuple[str, str, list[str]]) -> str:
    return f"{c[0]}={c[1]} {' '.join(c[2])}"


@pytest.mark.parametrize("case", ENV_PAIRS_REFUSED, ids=[_pair_id(c) for c in ENV_PAIRS_REFUSED])
@pytest.mark.parametrize("how", ["count", "params", "params old style", "after claude"])
def test_env_pair_that_runs_a_program_is_refused(repo: Repo, case: tuple[str, str, list[str]],
                                                 how: str) -> None:
    key, value, args = case
    if how == "count":
        extra = pairs_env([("color.ui", "never"), (key, value)])
        origin = "GIT_CONFIG_KEY_1: "
    elif how == "params":
        extra = {"GIT_CONFIG_PARAMETERS": f"'color.ui'='never' {sq(key)}={sq(value)}"}
        origin = "GIT_CONFIG_PARAMETERS: "
    elif how == "params old style":
        extra = {"GIT_CONFIG_PARAMETERS": f"'color.ui=never'\t{sq(key + '=' + value)}"}
        origin = "GIT_CONFIG_PARAMETERS: "
    else:
        extra = dict(CLAUDE_ENV, **pairs_env([*CLAUDE_PAIRS, (key, value)]))
        origin = "GIT_CONFIG_KEY_39: "
    env = dict(repo.env, **extra)
    err = assert_refused(repo, args, "dangerous-config", env=env)
    if not key.lower().startswith(("alias.", "core.alternaterefscommand")):
        assert err.startswith(f"ccm-guard: refused: {origin}{key.lower()} ".encode()), err


@pytest.mark.parametrize("extra", [
    {"GIT_CONFIG_COUNT": "1"},
    {"GIT_CONFIG_COUNT": "2", **pairs_env([("color.ui", "never")])} | {"GIT_CONFIG_COUNT": "2"},
    {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "color.ui"},
    {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_VALUE_0": "never"},
    {"GIT_CONFIG_COUNT": "x"},
    {"GIT_CONFIG_COUNT": "-1"},
    {"GIT_CONFIG_COUNT": "1k", **pairs_env([("color.ui", "never")])} | {"GIT_CONFIG_COUNT": "1k"},
    {"GIT_CONFIG_PARAMETERS": "core.pager=cat"},
    {"GIT_CONFIG_PARAMETERS": "'core.pager'='cat"},
    {"GIT_CONFIG_PARAMETERS": "'core.pager'cat"},
    {"GIT_CONFIG_PARAMETERS": "'core.pager'='cat'x"},
    {"GIT_CONFIG_PARAMETERS": " 'core.pager'='cat'"},
    {"GIT_CONFIG_PARAMETERS": "'core.pager'\\'x'"},
    {"GIT_CONFIG_PARAMETERS": "'color.ui'='never' 'core.hooksPath'=/tmp/x"},
], ids=lambda e: " ".join(f"{k}={v}" for k, v in e.items()))
def test_malformed_config_environment_is_refused_like_git(repo: Repo, extra: dict[str, str]) -> None:
    """What git itself rejects ("missing config key", "bogus format") is refused."""
    env = dict(repo.env, **extra)
    assert real(repo, "status", env=env).returncode == 128
    err = assert_refused(repo, ["status"], "redirect", env=env)
    assert err.startswith((b"ccm-guard: refused: GIT_CONFIG_COUNT=", b"ccm-guard: refused: GIT_CONFIG_PARAMETERS ")), err


@pytest.mark.parametrize("count", ["00", "01", "1000"])
def test_unusual_config_counts_are_refused(repo: Repo, count: str) -> None:
    """git reads 01 as 1; the shim takes only plain counts up to 999."""
    env = {**repo.env, **pairs_env([("color.ui", "never")] * 1000), "GIT_CONFIG_COUNT": count}
    assert_refused(repo, ["status"], "redirect", env=env)


@pytest.mark.parametrize("params", [
    "",
    "'color.ui'='never' ",
    "'log.abbrevCommit' 'color.ui'=",  # 'key' and 'key'= : true
    "'user.name'='O'\\''Brien'\\!''\t'color.ui=never'",
    "'diff.a=b.x'='y'",  # a subsection with =: key diff.a=b.x, harmless
], ids=repr)
def test_config_parameters_that_git_accepts_pass(repo: Repo, params: str) -> None:
    env = dict(repo.env, GIT_CONFIG_PARAMETERS=params)
    for args in (["config", "--get-regexp", "^(user|color|log|diff)\\."], ["log", "-1"]):
        assert_same(shim(repo, *args, env=env), real(repo, *args, env=env))
    assert not repo.log.exists()


def test_env_alias_of_another_command_passes(repo: Repo) -> None:
    """alias.X matters only for `git X`."""
    env = dict(repo.env, **pairs_env([("alias.st", "!touch /tmp/pwned"), ("alias.status", "!x")]))
    for args in (["log", "-1"], ["diff", "HEAD~1"]):
        assert_same(shim(repo, *args, env=env), real(repo, *args, env=env))
    assert_refused(repo, ["st"], "dangerous-config", env=env)
    # git would ignore an alias named like a builtin; the shim does not know the builtins.
    assert_refused(repo, ["status"], "dangerous-config", env=env)


def test_checkout_word_of_a_remote_tracking_branch_is_a_switch(repo: Repo) -> None:
    """git would create a local branch from <remote>/WORD: refused, even when WORD is
    also a tracked file (then git refuses it as ambiguous, present or deleted)."""
    for ref in ("refs/remotes/origin/feature", "refs/remotes/origin/t.txt", "refs/remotes/up/dir"):
        _setup_git(repo.env, repo.main, "update-ref", ref, repo.main_only)
    assert_refused(repo, ["checkout", "feature"], "switch")
    assert_refused(repo, ["checkout", "t.txt"], "switch")
    (repo.wt / "t.txt").unlink()  # now git would switch to a new branch t.txt
    assert_refused(repo, ["checkout", "t.txt"], "switch")
    assert_refused(repo, ["checkout", "dir"], "switch")
    assert real(repo, "rev-parse", "--abbrev-ref", "HEAD").stdout == f"{BRANCH}\n".encode()


def test_checkout_word_that_is_a_branch_and_a_file_is_a_switch(repo: Repo) -> None:
    (repo.wt / "main").write_text("a file named like the branch\n")
    _setup_git(repo.env, repo.wt, "add", "main")
    _setup_git(repo.env, repo.wt, "commit", "-q", "-m", "file main")
    (repo.wt / "main").write_text("changed\n")
    assert_refused(repo, ["checkout", "main"], "switch")


def test_checkout_word_restores_a_deleted_file_like_git(twins: tuple[Repo, Repo]) -> None:
    a, b = twins
    for r in (a, b):
        (r.wt / "a.txt").unlink()
        (r.wt / "dir" / "b.txt").write_text("dirty\n")
    assert_same(shim(a, "checkout", "a.txt"), real(b, "checkout", "a.txt"))
    assert_same(shim(a, "-C", "dir", "checkout", "b.txt"), real(b, "-C", "dir", "checkout", "b.txt"))
    assert (a.wt / "a.txt").read_text() == "alpha\nchanged by the task\n"
    assert (a.wt / "dir" / "b.txt").read_text() == "beta\n"
    assert_same(real(a, "status", "--porcelain"), real(b, "status", "--porcelain"))
    assert not a.log.exists()


def test_checkout_word_passes_when_the_role_allows_switch(repo: Repo) -> None:
    env = dict(repo.env, CCM_GUARD_ALLOW="switch")
    res = shim(repo, "checkout", "-q", "v1", env=env)
    assert res.returncode == 0, res.stderr
    assert real(repo, "rev-parse", "HEAD").stdout.decode().strip() == repo.base
    assert not repo.log.exists()


def test_hooks_off_on_the_persons_alias_is_refused(repo: Repo) -> None:
    """An alias may be anything (here commit): with hooks off, only known reads pass."""
    _setup_git(repo.env, repo.main, "config", "alias.ci", "commit")
    _setup_git(repo.env, repo.main, "config", "alias.st", "status")
    assert_refused(repo, ["-c", "core.hooksPath=/dev/null", "ci", "--allow-empty", "-m", "x"], "no-verify")
    assert_refused(repo, ["-c", "core.hooksPath=/dev/null", "st"], "no-verify")
    assert_same(shim(repo, "st"), real(repo, "st"))  # without the -c: the person's alias
    # The role may allow skipping hooks.
    env = dict(repo.env, CCM_GUARD_ALLOW="no-verify")
    args = ["-c", "core.hooksPath=/dev/null", "ci", "--allow-empty", "-m", "x"]
    assert shim(repo, *args, env=env).returncode == 0


def test_refusal_log_round_trips_awkward_arguments(repo: Repo) -> None:
    args = ["commit", "-n", "-m", 'a "quoted" \\ back\nslash\r\x01\x1f é ✓', ""]
    assert_refused(repo, args, "no-verify")
    assert log_lines(repo)[-1]["argv"] == args


def test_refusal_without_a_writable_log_still_refuses(repo: Repo) -> None:
    env = dict(repo.env, CCM_GUARD_LOG=str(repo.root / "missing-dir" / "log.jsonl"))
    res = shim(repo, "push", env=env)
    assert res.returncode == 1
    assert res.stderr.startswith(b"ccm-guard: refused: ") and res.stderr.count(b"\n") == 1
    env.pop("CCM_GUARD_LOG")
    res = shim(repo, "push", env=env)
    assert res.returncode == 1 and res.stderr.count(b"\n") == 1


def test_refusal_without_task_branch_refuses_branch_writes(repo: Repo) -> None:
    env = {k: v for k, v in repo.env.items() if k != "CCM_GUARD_BRANCH"}
    assert_refused(repo, ["checkout", "-b", BRANCH], "switch", env=env)


# --- allowed: byte-identical to the real git -----------------------------------

READ_ONLY = [
    ["status"],
    ["status", "--porcelain=v1", "-z"],
    ["log", "--oneline"],
    ["log", "-p", "-1"],
    ["diff", "HEAD~1"],
    ["diff", "--stat", "main...HEAD"],
    ["show", "--stat", "HEAD"],
    ["branch"],
    ["branch", "--show-current"],
    ["branch", "-a", "-v"],
    ["branch", "--list", "ccm/*"],
    ["branch", "--contains", "HEAD~1"],
    ["config", "--get", "user.name"],
    ["config", "user.name"],
    ["config", "--list", "--local"],
    ["config", "-l", "--show-origin"],
    ["config", "--get-regexp", "^user\\."],
    ["rev-parse", "HEAD"],
    ["rev-parse", "--abbrev-ref", "HEAD"],
    ["cat-file", "-p", "HEAD"],
    ["stash", "list"],
    ["-C", "dir", "status", "--short"],
    ["-C", "dir", "ls-files"],
    ["--no-pager", "log", "-1"],
    ["-c", "color.ui=always", "log", "-1", "--oneline"],
    ["--literal-pathspecs", "ls-files", "with space.txt"],
    ["ls-files", "-z"],
    ["symbolic-ref", "HEAD"],
    ["symbolic-ref", "--short", "-q", "HEAD"],
    ["remote", "-v"],
    ["remote"],
    ["worktree", "list", "--porcelain"],
    ["tag"],
    ["tag", "-l", "v*"],
    ["reflog", "-3"],
    ["merge-base", "HEAD", "main"],
    ["checkout", "-b", BRANCH],  # already exists: git's own error
    ["checkout", BRANCH],
    ["switch", BRANCH],
    ["branch", "-D", BRANCH],  # the checked-out branch: git's own error
    ["show", "no-such-rev"],
    ["status", "-h"],
    ["push", "-h"],
    ["--version"],
    ["no-such-command"],
    # switching something off (Claude Code: ls-files; Codex: rev-parse, status, remote)
    ["-c", "core.hooksPath=/dev/null", "ls-files", "--others", "--exclude-standard"],
    ["-c", "core.hooksPath=/dev/null", "rev-parse", "--show-toplevel"],
    ["-c", "core.hooksPath=/dev/null", "status", "--porcelain"],
    ["-c", "core.hooksPath=/dev/null", "remote", "-v"],
    ["-c", "core.hooksPath=/dev/null", "remote", "get-url", "origin"],  # git's own error
    ["-c", "Core.HooksPath=/dev/null", "-C", "dir", "diff", "HEAD~1"],
    ["-c", "core.hooksPath=/dev/null", "-c", "core.hooksPath=/dev/null", "log", "-1"],
    ["-c", "core.hooksPath=/dev/null", "config", "--get", "user.name"],
    ["-c", "core.hooksPath=/dev/null", "branch", "--list"],
    ["-c", "core.hooksPath=/dev/null", "tag", "-l"],
    ["-c", "core.hooksPath=/dev/null", "stash", "list"],
    ["-c", "core.hooksPath=/dev/null", "worktree", "list"],
    ["-c", "core.hooksPath=/dev/null", "symbolic-ref", "HEAD"],
    ["-c", "core.hooksPath=/dev/null", "reflog", "-3"],
    ["-c", "core.hooksPath=/dev/null", "show", "--stat", "HEAD"],
    ["-c", "core.fsmonitor=false", "status"],
    ["-c", "core.fsmonitor=", "-c", "core.fsmonitor=OFF", "-c", "core.fsmonitor=0", "status"],
    ["-c", "core.pager=cat", "log", "-1"],
    ["-c", "core.pager=", "log", "-1"],
    ["-c", "pager.log=false", "-c", "Pager.Diff=No", "-c", "pager.show=cat", "log", "-1"],
    ["-c", "pager.status=", "status"],
    ["-c", "core.hooksPath=", "status"],  # empty: git 2.39 looks for hooks in /
    ["-c", "hook.pre-commit.enabled=false", "-c", "hook.post-index-change.enabled=no", "status"],
    ["-c", "protocol.ext.allow=never", "-c", "Protocol.Allow=NEVER", "-c", "submodule.recurse=false", "log", "-1"],
    ["-c", "core.askPass=", "-c", "core.sshCommand=", "-c", "credential.helper=", "status"],
    ["-c", "credential.https://example.com.helper=", "-c", "help.autocorrect=0", "status"],
    ["-c", "core.editor=", "-c", "sequence.editor=", "-c", "diff.external=", "log", "-1"],
    ["-c", "alias.st=!touch /tmp/pwned", "status"],  # not the command being run
    ["-c", "core.alternateRefsCommand=f() { git --git-dir=\"$1\" for-each-ref; }; f", "log", "-1"],
    ["-c", "color.ui=always", "-c", "core.hooksPath=/dev/null", "diff", "main"],
]


@pytest.mark.parametrize("args", READ_ONLY, ids=lambda a: " ".join(a))
def test_allowed_read_only_is_byte_identical(repo: Repo, args: list[str]) -> None:
    expected = real(repo, *args)
    got = shim(repo, *args)
    assert_same(got, expected)
    assert not repo.log.exists()


def test_abbreviated_options_are_rejected_by_git(repo: Repo) -> None:
    """--no-verif would be --no-verify for git; under the shim git refuses it itself."""
    before = snapshot(repo)
    res = shim(repo, "commit", "--allow-empty", "--no-verif", "-m", "x")
    assert res.returncode != 0
    assert b"disallowed abbreviated or ambiguous option" in res.stderr
    assert snapshot(repo) == before


def _prepare_dirty(r: Repo) -> None:
    (r.wt / "a.txt").write_text("dirty\n")
    (r.wt / "new file.txt").write_text("new\n")
    (r.wt / "dir" / "b.txt").write_text("beta dirty\n")


WRITES = [
    # (args, prepare the tree first?)
    (["add", "new file.txt"], True),
    (["add", "-A"], True),
    (["commit", "-am", "subject with  spaces\n\nbody line one\nbody line two\n"], True),
    (["commit", "--allow-empty", "--allow-empty-message", "-m", ""], False),
    (["commit", "--allow-empty", "-m", "-n"], False),
    (["commit", "--allow-empty", "-mn"], False),
    (["commit", "--allow-empty", "-m", "x", "--no-verify", "--verify"], False),
    (["commit", "-a", "--fixup", "HEAD"], True),
    (["checkout", "--", "a.txt"], True),
    (["checkout", "HEAD", "--", "a.txt", "dir/b.txt"], True),
    (["checkout", "HEAD~1", "--", "a.txt"], True),
    (["checkout", "main", "--", "main-only.txt"], False),
    (["checkout", "."], True),
    (["checkout", "a.txt"], True),  # a tracked path, no revision: a file restore
    (["checkout", "-q", "a.txt"], True),
    (["checkout", "dir"], True),
    (["checkout", "*.txt"], True),
    (["-C", "dir", "checkout", "b.txt"], True),
    (["checkout", "with space.txt"], True),
    (["-c", "core.fsmonitor=false", "commit", "-qam", "fsmonitor off"], True),
    (["-c", "core.pager=cat", "--no-pager", "add", "-A"], True),
    (["checkout", "-f"], True),
    (["restore", "a.txt"], True),
    (["restore", "--source=HEAD~2", "--", "a.txt"], False),
    (["reset", "HEAD", "a.txt"], True),
    (["reset", "--", "a.txt"], True),
    (["reset"], True),
    (["reset", "--hard"], True),
    (["reset", "--hard", "HEAD~1"], False),
    (["reset", "-q", "--soft", "HEAD^"], False),
    (["reset", "--hard", "<base>"], False),
    (["reset", "--keep", BRANCH + "~1"], False),
    (["reset", "a.txt"], True),
    (["rm", "--cached", "-q", "t.txt"], False),
    (["mv", "t.txt", "t2.txt"], False),
    (["stash"], True),
    (["stash", "push", "-m", "a message"], True),
    (["clean", "-n"], True),
    (["revert", "--no-edit", "HEAD"], False),
    (["rebase", "HEAD~1"], False),
    (["rebase", "<base>"], False),
    (["merge", "--abort"], False),
    (["cherry-pick", "--abort"], False),
    (["branch", "-u", "main"], False),
    (["update-ref", "refs/heads/ccm/t1", "HEAD~1"], False),
    (["gc", "--auto"], False),
]


@pytest.mark.parametrize("case", WRITES, ids=[" ".join(c[0]).replace("\n", "\\n")[:50] for c in WRITES])
def test_allowed_write_matches_twin(twins: tuple[Repo, Repo], case: tuple[list[str], bool]) -> None:
    a, b = twins
    args, dirty = case
    for r in (a, b):
        if dirty:
            _prepare_dirty(r)
    args_a = [a.base if x == "<base>" else x for x in args]
    args_b = [b.base if x == "<base>" else x for x in args]
    assert args_a == args_b  # the twins have the same commit ids
    got = shim(a, *args_a)
    expected = real(b, *args_b)
    assert_same(got, expected)
    state = ["log", "--format=%H %s", "-3"], ["status", "--porcelain=v1"]
    for s in state:
        assert_same(real(a, *s), real(b, *s))
    assert not a.log.exists()


def test_allowed_by_role(repo: Repo) -> None:
    """CCM_GUARD_ALLOW lets a class through to the real git, untouched."""
    env = dict(repo.env, CCM_GUARD_ALLOW="remote dangerous-config")
    assert_same(shim(repo, "ls-remote", ".", env=env), real(repo, "ls-remote", "."))
    args = ["-c", "core.pager=less", "log", "-1"]
    assert_same(shim(repo, *args, env=env), real(repo, *args))
    # Other classes stay refused, and push --no-verify needs no-verify too.
    assert_refused(repo, ["push", "--no-verify"], "no-verify", env=env)
    assert_refused(repo, ["checkout", "main"], "switch", env=env)


def test_arguments_survive_untouched(repo: Repo, tmp_path: Path) -> None:
    """Spaces, quotes, newlines, empty strings and leading dashes reach git as given."""
    args = ["rev-parse", "--sq-quote", "a b", "", "-x", "--y", 'q"uo\'te', "new\nline",
            "tab\there", "*", "$HOME", "back\\slash"]
    assert_same(shim(repo, *args), real(repo, *args))
    args = ["-c", "color.ui=never", "rev-parse", "--sq-quote", "", " lead", "trail "]
    assert_same(shim(repo, *args), real(repo, *args))


# --- watched commands: a failed write is looked into ----------------------------------

def test_commit_keeps_stdin_and_status(twins: tuple[Repo, Repo]) -> None:
    a, b = twins
    for r in (a, b):
        _prepare_dirty(r)
    args = ["commit", "-aqF", "-"]
    got = subprocess.run(["git", *args], cwd=a.wt, env=a.env, input=b"from stdin\n\nbody\n",
                         capture_output=True, timeout=TIMEOUT)
    expected = subprocess.run([REAL_GIT, *args], cwd=b.wt, env=b.env, input=b"from stdin\n\nbody\n",
                              capture_output=True, timeout=TIMEOUT)
    assert_same(got, expected)
    assert real(a, "log", "-1", "--format=%B").stdout == b"from stdin\n\nbody\n\n"
    # A usage error: git's own status (129) and message.
    assert_same(shim(a, "commit", "--no-such-option"), real(b, "commit", "--no-such-option"))


def _no_git(res: subprocess.CompletedProcess[bytes], value: str) -> None:
    assert res.returncode == 1
    assert res.stdout == b""
    assert res.stderr == (f"ccm-guard: real git not found (CCM_GUARD_REAL_GIT={value}): "
                          "refusing to run\n").encode()


def test_fail_closed_when_real_git_unset(repo: Repo) -> None:
    env = {k: v for k, v in repo.env.items() if k != "CCM_GUARD_REAL_GIT"}
    _no_git(shim(repo, "status", env=env), "")


@pytest.mark.parametrize("value", ["/nonexistent/git", "git", "usr/bin/git", "/tmp"])
def test_fail_closed_when_real_git_is_not_an_executable_path(repo: Repo, value: str) -> None:
    _no_git(shim(repo, "status", env=dict(repo.env, CCM_GUARD_REAL_GIT=value)), value)


def test_fail_closed_when_real_git_is_the_shim(repo: Repo) -> None:
    for target in (str(SHIM), str(repo.root / "bin" / "git")):
        _no_git(shim(repo, "status", env=dict(repo.env, CCM_GUARD_REAL_GIT=target)), target)


def test_fail_closed_with_two_copies_of_the_shim(repo: Repo, tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    for d in (first, second):
        d.mkdir()
        shutil.copy2(SHIM, d / "git")
    env = dict(repo.env, PATH=f"{first}{os.pathsep}{second}{os.pathsep}{repo.env['PATH']}",
               CCM_GUARD_REAL_GIT=str(second / "git"))
    _no_git(shim(repo, "status", env=env), str(second / "git"))
    # The recursion guard alone (already inside a shim) gives the same answer.
    env["CCM_GUARD_SHIM_ACTIVE"] = "1"
    _no_git(shim(repo, "status", env=env), str(second / "git"))


def test_exports_recursion_guard_to_git(repo: Repo) -> None:
    """git runs a git-<name> helper from PATH: it sees what the shim exported."""
    helper = repo.root / "helpers" / "git-show-env"
    helper.parent.mkdir()
    helper.write_text("#!/bin/sh\nprintf '%s\\n' \"$CCM_GUARD_SHIM_ACTIVE\" "
                      "\"$GIT_TEST_DISALLOW_ABBREVIATED_OPTIONS\"\n")
    helper.chmod(0o755)
    env = dict(repo.env, PATH=f"{repo.env['PATH']}{os.pathsep}{helper.parent}")
    res = shim(repo, "show-env", env=env)
    assert (res.returncode, res.stdout) == (0, b"1\n1\n"), res.stderr


# --- the allowed path forks nothing -------------------------------------------------

STRACE_CASES = [
    ["rev-parse", "HEAD"],  # fast path
    ["-C", "dir", "status", "--short"],  # fast path with -C
    ["-c", "color.ui=never", "rev-parse", "HEAD"],  # full path, -c checked
    ["-c", "core.hooksPath=/dev/null", "ls-files"],  # fast path: hooks off on a read
    ["-c", "Core.HooksPath=/dev/null", "remote", "-v"],  # full path: a handler's read form
    ["branch", "--list", "ccm/*"],  # full path, a handler
    ["config", "user.name"],
    ["symbolic-ref", "--short", "-q", "HEAD"],  # the last handlers
    ["update-ref", "--no-deref", "-m", "x", "refs/heads/ccm/t1", "HEAD"],
]


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("args", STRACE_CASES, ids=lambda a: " ".join(a))
def test_allowed_path_execs_only_git(repo: Repo, tmp_path: Path, args: list[str]) -> None:
    out = tmp_path / "strace.out"
    res = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(out),
                          "git", *args], cwd=repo.wt, env=repo.env, capture_output=True,
                         timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    execs = [line for line in out.read_text().splitlines()
             if "execve(" in line and line.rstrip().endswith("= 0")]
    assert len(execs) == 2, execs
    assert f'execve("{repo.root / "bin" / "git"}"' in execs[0]
    assert f'execve("{REAL_GIT}"' in execs[1]


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
@pytest.mark.parametrize("agent", ["claude", "gemini"])
def test_env_config_is_judged_without_forking(repo: Repo, tmp_path: Path, agent: str) -> None:
    """Judging (and neutralising) the environment's pairs uses builtins only."""
    env, args = (dict(repo.env, **CLAUDE_ENV), CLAUDE_READS[5]) if agent == "claude" else \
        (dict(repo.env, **GEMINI_ENV), ["add", "a.txt"])  # a write: neutralised
    out = tmp_path / "strace.out"
    res = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(out),
                          "git", *args], cwd=repo.wt, env=env, capture_output=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    execs = [line for line in out.read_text().splitlines()
             if "execve(" in line and line.rstrip().endswith("= 0")]
    assert len(execs) == 2, execs
    assert f'execve("{REAL_GIT}"' in execs[1]


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_reset_outside_head_calls_git_once(repo: Repo, tmp_path: Path) -> None:
    """The one allowed exception: merge-base --is-ancestor, then git itself."""
    out = tmp_path / "strace.out"
    res = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve", "-o", str(out),
                          "git", "reset", "--soft", repo.base], cwd=repo.wt, env=repo.env,
                         capture_output=True, timeout=TIMEOUT)
    assert res.returncode == 0, res.stderr
    execs = [line for line in out.read_text().splitlines()
             if "execve(" in line and line.rstrip().endswith("= 0")]
    assert len(execs) == 3, execs
    assert '"merge-base", "--is-ancestor"' in execs[1]


# --- the script itself -----------------------------------------------------------------

def test_shim_is_posix_sh() -> None:
    assert SHIM.read_text().startswith("#!/bin/sh\n")
    assert os.access(SHIM, os.X_OK)
    for sh in ("sh", "dash"):
        if shutil.which(sh):
            subprocess.run([sh, "-n", str(SHIM)], check=True, timeout=TIMEOUT)
    if shutil.which("checkbashisms"):
        subprocess.run(["checkbashisms", "--posix", str(SHIM)], check=True, timeout=TIMEOUT)
