"""Fuzzed invocations and policy files: whatever is typed, ccm-guard answers with a
documented exit code, never a traceback, an error of one line naming the fix, and leaves
nothing behind when it refuses (no worktree, branch, row or lock).

Each example is a real `python -m ccm_guard` process (about 0.2 s), so the example counts
are small and the seed is printed by hypothesis on a failure (`--hypothesis-seed=N`
replays it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import git, make_repo
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ccm_guard.errors import ExitCode

DOCUMENTED = {int(code) for code in ExitCode}
ERRORS = {2, 5, 6, 7, 126, 127}  # a refusal: nothing may be left behind
WORDS = st.sampled_from(["", "HEAD", "main", "nope", "..", "a..b", "HEAD~9", "^HEAD", "-x", "--", "0", "-1",
                         "1e9", "nan", "/", "/dev/null", "/proc/self/mem", "~", "$HOME", "a b", "é", "\x7f",
                         "../../etc", "ccm/x", "refs/heads/main", "x" * 300, ".lock", "t.lock"])
OPTIONS = st.sampled_from(["--task", "--base", "--role", "--timeout", "--grace", "--policy", "--on-fail", "--sandbox",
                           "--allow-port", "--agent", "--snapshot-every", "--sparse", "--setup-timeout", "--fork",
                           "--jobs", "--check-timeout", "--into", "--strategy", "--older-than", "--archive-days",
                           "--repo", "--format", "--json", "--all", "--read-only", "--no-network", "--pty", "-n"])
COMMANDS = st.sampled_from([["exec"], ["task", "show"], ["task", "apply"], ["task", "discard"], ["task", "restore"],
                            ["task", "rollback"], ["task", "diff"], ["task", "compare"], ["task", "pick"], ["audit"],
                            ["gc"], ["policy", "check"], ["policy", "show"], ["check-paths"], ["verify"],
                            ["pool", "status"], ["roots"], ["task", "list"]])


def _ccm(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ccm_guard", *args], cwd=cwd, capture_output=True, text=True,
                          errors="replace", timeout=60, stdin=subprocess.DEVNULL)


def _residue(repo: Path) -> tuple[str, str, str, list[str]]:
    state = Path(os.environ["CCM_GUARD_HOME"])
    locks = sorted(str(p.relative_to(state)) for p in state.rglob("*.lock")) if state.exists() else []
    rows = _ccm(["task", "list", "--all", "--all-repos", "--json"], repo)
    return (git(repo, "worktree", "list", "--porcelain"), git(repo, "for-each-ref", "refs/heads/"),
            json.dumps(json.loads(rows.stdout)["tasks"] if rows.returncode == 0 else rows.stderr), locks)


def _judge(proc: subprocess.CompletedProcess[str], args: list[str]) -> None:
    assert proc.returncode in DOCUMENTED, (args, proc.returncode, proc.stderr[-500:])
    assert "Traceback" not in proc.stderr, (args, proc.stderr[-2000:])
    if proc.returncode in ERRORS:
        last = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
        assert last.startswith("ccm-guard: error: "), (args, proc.stderr[-500:])


@pytest.fixture(scope="module")
def fuzz_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("fuzz") / "repo")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(command=COMMANDS, rest=st.lists(st.one_of(OPTIONS, WORDS), max_size=6))
def test_fuzzed_invocations(fuzz_repo: Path, command: list[str], rest: list[str]) -> None:
    args = [*command, *rest]
    if command == ["exec"]:
        args += ["--", "true"]  # an agent that does nothing: the run itself is quick
    before = _residue(fuzz_repo)
    proc = _ccm(args, fuzz_repo)
    _judge(proc, args)
    if proc.returncode in ERRORS:
        assert _residue(fuzz_repo) == before, (args, proc.stderr[-500:])


TOML_VALUES = st.recursive(
    st.one_of(st.booleans(), st.integers(-2, 10**12), st.text(max_size=20), st.sampled_from(["[z-a]", "**/", "!x", "\\\\"])),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(
        ["allow", "forbid", "extends", "limits", "max_files", "setup", "setup_timeout", "ci_files", "run_files", "git_allow",
         "read_only", "must_commit", "snapshot_every", "x"]), inner, max_size=4),
    max_leaves=12)


def _toml(value: object) -> str:
    """A TOML rendering of plain data (json's strings, numbers and booleans are TOML's)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(top=st.dictionaries(st.sampled_from(["default_role", "setup", "setup_timeout", "roles", "x"]), TOML_VALUES,
                           max_size=3),
       role=st.dictionaries(st.sampled_from(["allow", "forbid", "extends", "limits", "setup", "ci_files", "run_files", "git_allow",
                                             "snapshot_every", "y"]), TOML_VALUES, max_size=4),
       raw=st.binary(max_size=40))
def test_fuzzed_policy_files(fuzz_repo: Path, tmp_path_factory: pytest.TempPathFactory, top: dict[str, object],
                             role: dict[str, object], raw: bytes) -> None:
    text = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items() if k != "roles")
    text += "[roles.fz]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in role.items())
    path = tmp_path_factory.mktemp("policy") / "policy.toml"
    for data in (text.encode(), raw, text.encode() + raw):
        path.write_bytes(data)
        proc = _ccm(["policy", "check", str(path)], fuzz_repo)
        _judge(proc, ["policy", "check", repr(data[:80])])
        assert proc.returncode in (0, 2)
        before = _residue(fuzz_repo)
        run = _ccm(["exec", "--policy", str(path), "--role", "fz", "--no-require-commit", "--cleanup", "--", "true"],
                   fuzz_repo)
        _judge(run, ["exec --policy", repr(data[:80])])
        if run.returncode in ERRORS:
            assert _residue(fuzz_repo) == before
