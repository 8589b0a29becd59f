"""README's quick start is what CI runs: its two command lines appear in .ci/run exactly
(CI runs those lines on a clean checkout, so a README that drifts fails here first)."""

from __future__ import annotations

import re

from conftest import ROOT


def test_ci_runs_the_readme_quick_start_lines_literally() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    lines = [block.strip() for block in re.findall(r"```sh\n(.*?)```", section, re.S)]
    assert len(lines) == 2 and all("\n" not in line for line in lines), lines
    assert "ccm-guard demo" in lines[0] and "pytest" in lines[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    for line in lines:
        assert line in ci, f".ci/run does not run README's line: {line}"
        assert line.startswith("python3 -m venv .venv && ")  # no install into the system Python (PEP 668)
