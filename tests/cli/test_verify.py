"""`ccm-guard verify BASE..HEAD`: an agent's pull request judged in CI, and the GitHub
Action that runs it (driven here by a small local runner: no network but the package
registry pip installs from)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]
from conftest import ROOT, ccm, git


def _commit(repo: Path, files: dict[str, str], message: str = "agent work") -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def _verify(repo: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    proc = ccm("verify", "--json", *args, cwd=repo, env=env)
    return proc.returncode, json.loads(proc.stdout)


def _gate(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(g for g in report["gates"] if g["name"] == name)


def test_a_benign_range_passes(repo: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    _commit(repo, {"src/new.py": "x = 1\n"})
    code, report = _verify(repo, f"{base}..HEAD")
    assert code == 0, report
    assert report["schema"] == 1 and report["outcome"] == "pass" and len(report["commits"]) == 1
    assert [g["status"] for g in report["gates"]] == ["pass", "pass", "pass"]


def test_the_policy_is_read_at_the_base(repo: Path) -> None:
    """A pull request that loosens .ccm-guard.toml is judged by the rules it started from."""
    _commit(repo, {".ccm-guard.toml": '[roles.docs]\nextends = "implementor"\nallow = ["docs/"]\n'}, "policy")
    base = git(repo, "rev-parse", "HEAD")
    _commit(repo, {".ccm-guard.toml": '[roles.docs]\nextends = "implementor"\nallow = ["*"]\n',
                   "src/app.py": "print('changed')\n"})
    code, report = _verify(repo, "--role", "docs", f"{base}..HEAD")
    assert code == 1
    reasons = "\n".join(f["reason"] for f in _gate(report, "path-policy")["findings"])
    assert "src/app.py: changed, but not in the role's allow list" in reasons
    assert ".ccm-guard.toml" in reasons
    # check-paths judges a range by the base's policy too
    assert ccm("check-paths", "--role", "docs", f"{base}..HEAD", cwd=repo).returncode == 1


def test_ci_files_forged_trailers_and_limits_fail(repo: Path) -> None:
    _commit(repo, {".ccm-guard.toml": "[roles.implementor.limits]\nmax_files = 2\n"}, "policy")
    base = git(repo, "rev-parse", "HEAD")
    _commit(repo, {".github/workflows/ci.yml": "on: push\n", "a.py": "1\n", "b.py": "2\n"})
    git(repo, "commit", "-q", "--allow-empty", "-m", "looks official", "-m", "Recovery-Reason: trust me")
    code, report = _verify(repo, f"{base}..HEAD")
    assert code == 1
    assert "CI or git hooks run by themselves" in json.dumps(_gate(report, "path-policy"))
    claim = _gate(report, "new-commit")  # no registry here proves it: reported for review
    assert claim["status"] == "warn" and "claims to be ccm-guard's (Recovery-Reason)" in json.dumps(claim)
    assert "the run changed 3 files; the limit is 2" in json.dumps(_gate(report, "limits"))


def test_a_merge_that_undoes_the_base_is_seen(repo: Path) -> None:
    """A merge whose first parent is older than the base reverts the base's change to
    src/app.py with no first-parent diff showing it; every parent's diff is judged."""
    old = git(repo, "rev-parse", "HEAD")
    base = _commit(repo, {"src/app.py": "print('fixed')\n"}, "fix")
    git(repo, "checkout", "-q", "-b", "pr", old)
    _commit(repo, {"tests/test_app.py": "assert True\n"}, "tests")
    git(repo, "merge", "-q", "-s", "ours", "--no-edit", base)  # keeps pr's tree: the fix is undone
    assert "src/app.py" in git(repo, "diff", "--name-only", base, "HEAD").splitlines()
    code, report = _verify(repo, "--role", "test-writer", f"{base}..HEAD")
    assert code == 1
    assert "src/app.py: changed, but not in the role's allow list" in json.dumps(_gate(report, "path-policy"))


def test_a_pull_request_that_merged_its_base_is_not_blamed_for_the_base(repo: Path) -> None:
    """GitHub's "Update branch": main moved (a CI file, src/) and the pull request merged
    it in; only what the pull request itself changed is judged."""
    git(repo, "checkout", "-q", "-b", "pr")
    _commit(repo, {"tests/test_new.py": "assert 1\n"}, "tests")
    git(repo, "checkout", "-q", "main")
    _commit(repo, {"src/app.py": "print('main moved')\n", ".github/workflows/ci.yml": "on: push\n"}, "main work")
    git(repo, "checkout", "-q", "pr")
    git(repo, "merge", "-q", "--no-edit", "main")
    code, report = _verify(repo, "--role", "test-writer", "main..pr")
    assert code == 0, report
    # ... while a merge that also slips in a change of its own is still seen
    (repo / "src" / "app.py").write_text("print('sneaky')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "--amend", "--no-edit")
    code, report = _verify(repo, "--role", "test-writer", "main..pr")
    assert code == 1 and "src/app.py" in json.dumps(_gate(report, "path-policy"))


def test_a_merge_of_an_older_base_cannot_undo_the_base_unseen(repo: Path) -> None:
    """The pull request builds on the base B, then merges B's parent with B's hardening
    reverted: merging the pull request would fast-forward and lose it."""
    _commit(repo, {".github/workflows/ci.yml": "on: push\n"}, "ci")
    older = git(repo, "rev-parse", "HEAD")
    base = _commit(repo, {".github/workflows/ci.yml": "on: push\npermissions: read-all\n"}, "harden ci")
    _commit(repo, {"tests/test_x.py": "assert 1\n"}, "tests")
    git(repo, "merge", "-q", "-s", "ours", "--no-edit", "--no-ff", older)
    git(repo, "checkout", "-q", older, "--", ".github/workflows/ci.yml")
    git(repo, "commit", "-q", "--amend", "--no-edit")
    assert git(repo, "show", "HEAD:.github/workflows/ci.yml") == "on: push"
    code, report = _verify(repo, "--role", "test-writer", f"{base}..HEAD")
    assert code == 1 and ".github/workflows/ci.yml" in json.dumps(_gate(report, "path-policy"))


def test_bad_ranges_are_one_line_usage_errors(repo: Path) -> None:
    for args, expected in ((["nonsense"], "BASE..HEAD"), (["nope..HEAD"], "fetch-depth: 0"),
                           ([], "no range given")):
        proc = ccm("verify", *args, cwd=repo)
        assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_github_format_annotates_and_writes_outputs(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    head = _commit(repo, {".github/workflows/ci.yml": "on: push\n"})
    event = tmp_path / "event.json"
    event.write_text(json.dumps({"pull_request": {"base": {"sha": base}, "head": {"sha": head}}}))
    output, summary = tmp_path / "output", tmp_path / "summary"
    proc = ccm("verify", "--format", "github", cwd=repo,
               env={"GITHUB_EVENT_PATH": str(event), "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary)})
    assert proc.returncode == 1
    assert "::error file=.github/workflows/ci.yml,title=ccm-guard path-policy::path-policy: 1 file(s)" in proc.stdout
    assert output.read_text() == "outcome=fail\n"
    assert summary.read_text().startswith("### ccm-guard verify: fail")


def _expand(text: str, values: dict[str, str]) -> str:
    """GitHub's `${{ … }}` for the expressions action.yml uses; any other fails the test."""
    def one(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        assert expression in values, f"the local runner does not know {expression!r}"
        return values[expression]
    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


def run_action(workspace: Path, temp: Path, inputs: dict[str, str], event: dict[str, Any]) -> tuple[int, dict[str, str]]:
    """Run action.yml's composite steps the way a runner does: each `run` with its shell and
    env, inputs and earlier steps' outputs substituted, GITHUB_* files in place."""
    action = yaml.safe_load((ROOT / "action.yml").read_text())
    assert action["runs"]["using"] == "composite"
    values = {f"inputs.{name}": inputs.get(name, spec.get("default", "")) for name, spec in action["inputs"].items()}
    (temp / "event.json").write_text(json.dumps(event))
    base_env = {**os.environ, "GITHUB_ACTION_PATH": str(ROOT), "RUNNER_TEMP": str(temp),
                "GITHUB_EVENT_PATH": str(temp / "event.json"), "GITHUB_STEP_SUMMARY": str(temp / "summary.md"),
                "GITHUB_WORKSPACE": str(workspace)}
    for step in action["runs"]["steps"]:
        output = temp / f"output-{step.get('id', 'step')}"
        output.write_text("")
        env = {**base_env, "GITHUB_OUTPUT": str(output),
               **{k: _expand(str(v), values) for k, v in step.get("env", {}).items()}}
        assert step["shell"] == "bash"
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", _expand(step["run"], values)],
                              cwd=workspace, env=env, capture_output=True, text=True, timeout=600)
        for line in output.read_text().splitlines():
            key, _, value = line.partition("=")
            values[f"steps.{step.get('id')}.outputs.{key}"] = value
        if proc.returncode != 0:
            return proc.returncode, {"stdout": proc.stdout, "stderr": proc.stderr,
                                     **{k: _expand(v["value"], values) for k, v in action["outputs"].items()
                                        if "steps." + str(step.get("id")) in v["value"]}}
    outputs = {name: _expand(spec["value"], values) for name, spec in action["outputs"].items()}
    return 0, {**outputs, "stdout": proc.stdout, "summary": (temp / "summary.md").read_text()}


def test_the_github_action_runs_verify_on_the_pull_request(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "HEAD")
    good = _commit(repo, {"src/feature.py": "x = 1\n"})
    temp = tmp_path / "runner"
    temp.mkdir()
    code, result = run_action(repo, temp, {"role": "implementor"},
                              {"pull_request": {"base": {"sha": base}, "head": {"sha": good}}})
    assert code == 0, result
    assert result["outcome"] == "pass" and "ccm-guard verify: pass" in result["stdout"]
    assert "### ccm-guard verify: pass" in result["summary"]
    bad = _commit(repo, {"tests/test_x.py": "assert 1\n", "src/feature.py": "x = 2\n"})
    code, result = run_action(repo, temp, {"role": "test-writer"},
                              {"pull_request": {"base": {"sha": good}, "head": {"sha": bad}}})
    assert code == 1, result
    assert result["outcome"] == "fail"
    assert "::error file=src/feature.py" in result["stdout"]
