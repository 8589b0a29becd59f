"""`ccm-guard demo`: no git hints, claims that match what happened, and every command it
prints works as printed."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from conftest import ccm


def test_demo_prints_nothing_that_will_not_be_there(tmp_path: Path) -> None:
    before = set(Path("/tmp").glob("ccm-guard-demo-*"))
    proc = ccm("demo", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hint:" not in proc.stdout + proc.stderr and "warning:" not in proc.stderr
    assert "the good agent passed and the bad one was caught" in proc.stdout
    assert "FAIL    clean-tree" in proc.stdout and "next:" not in proc.stdout and "worktree:" not in proc.stdout
    assert proc.stdout.rstrip().splitlines()[-2] == "Try it on your own repository:"
    assert set(Path("/tmp").glob("ccm-guard-demo-*")) == before  # nothing left behind


def test_demo_keep_prints_next_steps_that_run(tmp_path: Path) -> None:
    proc = ccm("demo", "--keep", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    setup = re.search(r"export CCM_GUARD_HOME=(\S+); cd (\S+)", proc.stdout)
    assert setup is not None, proc.stdout
    home, repo = setup.group(1), Path(setup.group(2))
    try:
        steps = [line.split(":", 1)[1].split("   (")[0].strip() for line in proc.stdout.splitlines()
                 if re.match(r"\s+(review|apply|check again|discard):\s+ccm-guard ", line)]
        assert len(steps) == 4, proc.stdout
        for step in steps:
            argv = shlex.split(step)
            assert argv[0] == "ccm-guard"
            ran = subprocess.run([sys.executable, "-m", "ccm_guard", *argv[1:]], cwd=repo, capture_output=True,
                                 text=True, env={**os.environ, "CCM_GUARD_HOME": home}, timeout=60)
            # audit of the bad task fails its gates again (exit 1), as the verdict said it would
            assert ran.returncode == (1 if argv[1] == "audit" else 0), (step, ran.stdout, ran.stderr)
    finally:
        subprocess.run(["rm", "-rf", str(repo.parent)], check=False)
