"""Every --json document is one object with `schema` first, and docs/json.md names every
top-level key of the verdict and of verify's report."""

from __future__ import annotations

import json
import re
from pathlib import Path

from conftest import ROOT, ccm, git, run_exec, write_agent

DOC = (ROOT / "docs" / "json.md").read_text()


def _documented(key: str) -> bool:
    return re.search(rf"`{re.escape(key)}`", DOC) is not None


def test_every_json_document_starts_with_the_schema(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo x > new.txt\ngit add new.txt\ngit commit -q -m work")
    result = run_exec(repo, agent, "--task", "t1")
    base = git(repo, "rev-parse", "HEAD")
    documents = [result.stdout] + [ccm(*args, "--json", cwd=repo).stdout for args in (
        ["task", "list"], ["task", "show", "t1"], ["audit", "t1"], ["gc", "--dry-run"], ["pool", "status"],
        ["policy", "show"], ["check-paths", f"{base}..HEAD"], ["verify", f"{base}..HEAD"],
        ["roots"], ["task", "show", "nope"], ["task", "discard", "t1"])]
    for text in documents:
        data = json.loads(text)
        assert isinstance(data, dict) and next(iter(data)) == "schema" and data["schema"] == 1, text[:200]


def test_docs_name_every_key_of_the_verdict_and_of_verify(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo x > new.txt\ngit add new.txt\ngit commit -q -m work")
    verdict = run_exec(repo, agent).verdict
    missing = [k for k in verdict if not _documented(k)]
    missing += [k for k in verdict["agent"] if not _documented(k)]
    report = json.loads(ccm("verify", "--json", f"{verdict['base']}..{verdict['head']}", cwd=repo).stdout)
    missing += [k for k in report if not _documented(k)]
    assert not missing, f"docs/json.md does not name {missing}"
