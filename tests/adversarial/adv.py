"""Helpers shared by the adversarial suite (tests/adversarial/test_*.py).

Every test there runs one scripted attacking agent through a real `ccm-guard exec` and
asserts both sides: what the attack did to the repository (or that it was prevented,
with the prevention shown: a refusal line, a denied write) and what ccm-guard reported.
Planted code appends a line to a marker file, so a test can show that ccm-guard never
ran it and that the person's own git later would.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import AUTHOR, ExecResult, git

from ccm_guard.prevent import sandbox

COMMIT = 'echo "agent work" > work.txt; git add -A; git commit -q -m "agent work"'
LANDLOCK = sandbox.abi() > 0
needs_landlock = pytest.mark.skipif(not LANDLOCK, reason="this kernel has no Landlock")
# For attacks where the OS sandbox matters: run them without it and under it.
SANDBOXES = ["none", pytest.param("landlock", marks=needs_landlock)]


def plain_git(where: Path, *args: str, input: str | None = None,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Git as the person would run it later: no hardening, nothing checked."""
    return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, input=input,
                          env={**os.environ, **AUTHOR, "GIT_TERMINAL_PROMPT": "0", **(env or {})}, timeout=60)


def all_paths(res: ExecResult, gate: str) -> list[str]:
    return [p for f in res.gate(gate)["findings"] for p in f["paths"]]


def refusals(res: ExecResult, op: str | None = None) -> list[dict[str, Any]]:
    """What the shim and the hooks refused during the run, as the verdict lists it."""
    return [r for r in res.verdict["refusals"] if op is None or r.get("op") == op]


def common_dir(repo: Path) -> Path:
    return repo / ".git"


def admin_of(repo: Path, task: str) -> Path:
    return repo / ".git" / "worktrees" / task


def branch_files(repo: Path, branch: str) -> list[str]:
    return git(repo, "ls-tree", "-r", "--name-only", branch).splitlines()


def with_policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    return path
