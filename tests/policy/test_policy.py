"""Roles, policy files and the path-policy and limits gates, with real agents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import ExecResult, ccm, git, run_exec, write_agent

from ccm_guard.detect.policy_at import check_staged


def commit_all(repo: Path, message: str = "policy") -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


def findings(res: ExecResult, gate: str) -> list[dict[str, Any]]:
    return [f for g in res.verdict["gates"] if g["name"] == gate for f in g["findings"]]


def paths_of(res: ExecResult, gate: str) -> list[str]:
    return sorted(p for f in findings(res, gate) for p in f["paths"])


# --- roles and the policy file ------------------------------------------------------------------


def test_test_writer_may_only_touch_tests(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """mkdir -p tests; echo 'def test_x(): pass' > tests/test_x.py
echo 'print(2)' > src/app.py
git add -A; git commit -qm 'tests and a sneaky fix'""")
    res = run_exec(repo, agent, "--role", "test-writer")
    assert res.code == 1
    assert paths_of(res, "path-policy") == ["src/app.py"]
    assert "not in the role's allow list" in res.reasons("path-policy")
    # The pre-commit hook (with the rules exec compiled for it) refused the commit on the spot.
    refused = [r for r in res.verdict["refusals"] if r.get("op") == "path-policy"]
    assert refused and "src/app.py" in json.dumps(refused)
    assert git(repo, "rev-parse", "ccm/" + res.verdict["task"]) == res.verdict["base"]
    assert res.verdict["gates"][0]["name"] == "processes"


def test_reviewer_may_change_nothing_and_must_not_move_head(repo: Path, tmp_path: Path) -> None:
    quiet = run_exec(repo, write_agent(tmp_path, "cat README.md >/dev/null", "read.sh"), "--role", "reviewer")
    assert quiet.code == 0
    names = [g["name"] for g in quiet.verdict["gates"]]
    assert "head-frozen" in names and "new-commit" not in names
    meddling = run_exec(repo, write_agent(tmp_path, "echo opinion > notes.md", "meddle.sh"), "--role", "reviewer")
    assert meddling.code == 1
    assert "the role may change no files" in meddling.reasons("path-policy")


def test_policy_is_read_from_the_base_commit_not_the_worktree(repo: Path, tmp_path: Path) -> None:
    (repo / ".ccm-guard.toml").write_text('[roles.docs]\nextends = "implementor"\nallow = ["docs/"]\n')
    commit_all(repo)
    agent = write_agent(tmp_path, """printf '[roles.docs]\\nallow = ["**"]\\n' > .ccm-guard.toml
echo x > src/new.py; git add -A; git commit -qm 'widen my own rules'""")
    res = run_exec(repo, agent, "--role", "docs")
    assert res.code == 1
    assert paths_of(res, "path-policy") == [".ccm-guard.toml", "src/new.py"]
    assert "forbidden by '/.ccm-guard.toml'" in res.reasons("path-policy")


def test_pyproject_tool_table_and_policy_show(repo: Path) -> None:
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n[tool.ccm-guard]\ndefault_role = "qa"\n'
                                         '[tool.ccm-guard.roles.qa.limits]\nmax_files = 3\n')
    commit_all(repo)
    shown = json.loads(ccm("policy", "show", "--json", cwd=repo).stdout)
    assert shown["default_role"] == "qa"
    qa = shown["roles"]["qa"]
    assert qa["limits.max_files"] == {"value": 3, "from": f"{git(repo, 'rev-parse', 'HEAD')[:12]}:pyproject.toml"}
    assert qa["must_commit"]["from"] == "built-in"
    text = ccm("policy", "show", "--role", "qa", cwd=repo).stdout
    assert "[roles.qa]" in text and "limits.max_files = 3" in text


@pytest.mark.parametrize("content, where", [
    ('[roles.x]\nallwo = ["a"]\n', ":2: roles.x.allwo: unknown key"),
    ('[roles.x]\nmust_commit = "yes"\n', ":2: roles.x.must_commit: must be true or false"),
    ('[roles.x]\nforbid = ["a/**/**/[", ""]\n', ":2: roles.x.forbid: patterns must be non-empty"),
    ('[roles.x]\nextends = "nobody"\n', ":2: roles.x.extends: unknown role 'nobody'"),
    ('[roles.x.limits]\nmax_filez = 1\n', ":2: roles.x.limits.max_filez: unknown limit"),
    ('[roles.x.limits]\nmax_files = -1\n', ":2: roles.x.limits.max_files: must be a whole number"),
    ('[roles.x]\nsnapshot_every = -2\n', ":2: roles.x.snapshot_every: must be a whole number, 0 or more"),
    ('[roles.x]\nsnapshot_every = "often"\n', ":2: roles.x.snapshot_every: must be a whole number"),
    ('[roles.x]\ngit_allow = ["teleport"]\n', ":2: roles.x.git_allow: unknown git operation class 'teleport'"),
    ('default_role = "ghost"\n', ":1: default_role: default_role 'ghost' is not a role"),
    ('[roles.x\nallow = 1\n', ":1: not valid TOML"),
    ('colour = "blue"\n', ":1: colour: unknown key"),
])
def test_bad_policy_files_name_file_line_and_key(tmp_path: Path, content: str, where: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    proc = ccm("policy", "check", str(path), cwd=tmp_path)
    assert proc.returncode == 2
    assert where in proc.stderr and str(path) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_policy_refuses_exec_before_anything_is_made(repo: Path, tmp_path: Path) -> None:
    unknown = ccm("exec", "--role", "astronaut", "--", "true", cwd=repo)
    assert unknown.returncode == 2 and "unknown role 'astronaut'" in unknown.stderr
    (repo / ".ccm-guard.toml").write_text('[roles.x]\nallow = "src/"\n')
    commit_all(repo)
    proc = ccm("exec", "--", "true", cwd=repo)
    assert proc.returncode == 2 and ".ccm-guard.toml:2: roles.x.allow: must be a list" in proc.stderr
    assert git(repo, "for-each-ref", "refs/heads/ccm/") == ""


def test_user_default_and_explicit_policy_layers(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    Path(os.environ["CCM_GUARD_HOME"]).mkdir(parents=True, exist_ok=True)
    Path(os.environ["CCM_GUARD_HOME"], "policy.toml").write_text('[roles.implementor.limits]\nmax_files = 5\n')
    extra = tmp_path / "extra.toml"
    extra.write_text('[roles.implementor.limits]\nmax_commits = 1\n')
    shown = json.loads(ccm("policy", "show", "--json", "--policy", str(extra), cwd=repo).stdout)["roles"]["implementor"]
    assert shown["limits.max_files"]["value"] == 5 and shown["limits.max_files"]["from"].endswith("policy.toml")
    assert shown["limits.max_commits"] == {"value": 1, "from": str(extra)}


# --- evasions of the path rules ---------------------------------------------------------------


def test_rename_of_a_source_file_into_tests_is_caught_on_both_sides(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "mkdir -p tests; git mv src/app.py tests/app.py; git commit -qm move")
    res = run_exec(repo, agent, "--role", "test-writer")
    assert paths_of(res, "path-policy") == ["src/app.py"]
    assert "deleted, but not in the role's allow list" in res.reasons("path-policy")


def test_symlinks_out_of_the_worktree_and_to_forbidden_paths(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """ln -s ../../outside escape; ln -s /etc/passwd abs; ln -s .gitattributes attrs
ln -s src/app.py fine; git add -A; rgit commit -qm links; ln -s ../../x dirty-link""")
    res = run_exec(repo, agent)
    reasons = res.reasons("path-policy")
    assert "escape: is a symlink pointing outside the worktree ('../../outside')" in reasons
    assert "abs: is a symlink pointing outside the worktree ('/etc/passwd')" in reasons
    assert "attrs: is a symlink to '.gitattributes', which is forbidden by '**/.gitattributes'" in reasons
    assert "dirty-link: is a symlink pointing outside the worktree" in reasons
    assert "fine" not in paths_of(res, "path-policy")


def test_mode_change_is_reported_and_gitlink_is_refused(repo: Path, tmp_path: Path) -> None:
    sha = git(repo, "rev-parse", "HEAD")
    agent = write_agent(tmp_path, f"""chmod +x src/app.py
git update-index --add --cacheinfo 160000,{sha},vendor/lib
git add src/app.py; rgit commit -qm 'exec bit and a submodule'""")
    res = run_exec(repo, agent)
    by_path = {f["paths"][0]: f for f in findings(res, "path-policy")}
    assert by_path["src/app.py"]["severity"] == "warn" and "made executable" in by_path["src/app.py"]["reason"]
    assert by_path["vendor/lib"]["severity"] == "fail" and "gitlink" in by_path["vendor/lib"]["reason"]


def test_gitattributes_filter_and_gitmodules_are_forbidden(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """echo '* filter=evil' > .gitattributes
printf '[submodule "x"]\\n\\turl = ext::sh -c id\\n' > .gitmodules
git add -A; git commit -qm attrs""")
    res = run_exec(repo, agent)
    assert paths_of(res, "path-policy") == [".gitattributes", ".gitmodules"]


def test_odd_names_are_checked_exactly(repo: Path, tmp_path: Path) -> None:
    (repo / ".ccm-guard.toml").write_text('[roles.implementor]\nforbid = ["secret*"]\n')
    commit_all(repo)
    agent = write_agent(tmp_path, r"""printf x > 'secret file.txt'; printf x > "$(printf 'secret\nname')"
printf x > "$(printf 'secret\377bytes')"; printf x > 'fine name.txt'
git add -A; git commit -qm odd""")
    res = run_exec(repo, agent)
    caught = paths_of(res, "path-policy")
    assert "secret file.txt" in caught and "secret\nname" in caught
    assert any(p.startswith("secret") and "bytes" in p for p in caught)
    assert "fine name.txt" not in caught


def test_unicode_and_case_twins_are_caught(repo: Path, tmp_path: Path) -> None:
    (repo / "café.txt").write_text("nfc\n")
    commit_all(repo)
    agent = write_agent(tmp_path, """printf x > "$(printf 'cafe\\314\\201.txt')"; printf x > README.MD
printf x > .GITATTRIBUTES; git add -A; rgit commit -qm twins""")
    res = run_exec(repo, agent)
    reasons = res.reasons("path-policy")
    assert "cafe\u0301.txt: is the same file as 'caf\u00e9.txt' on case-insensitive" in reasons
    assert "README.MD: is the same file as 'README.md'" in reasons
    assert ".GITATTRIBUTES: changed, but forbidden by '**/.gitattributes' (as '.gitattributes'" in reasons


def test_forbidden_change_undone_in_a_later_commit_is_still_seen(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """echo '* text' > .gitattributes; git add -A; rgit commit -qm add
git rm -q .gitattributes; rgit commit -qm remove; echo ok > src/ok.py; git add -A; git commit -qm ok""")
    res = run_exec(repo, agent)
    assert git(repo, "diff", "--name-only", res.verdict["base"], res.verdict["head"]) == "src/ok.py"
    assert paths_of(res, "path-policy") == [".gitattributes", ".gitattributes"]


# --- limits -------------------------------------------------------------------------------------


def test_limits_report_the_figure_and_the_limit(repo: Path, tmp_path: Path) -> None:
    (repo / ".ccm-guard.toml").write_text(
        "[roles.implementor.limits]\nmax_files = 2\nmax_file_bytes = 1000\nmax_added_bytes = 1500\nmax_commits = 1\n")
    commit_all(repo)
    agent = write_agent(tmp_path, """head -c 1200 /dev/zero | tr '\\0' a > big.txt; git add -A; git commit -qm one
echo a > a.txt; echo b > b.txt; git add -A; git commit -qm two; head -c 600 /dev/zero > dirty.bin""")
    res = run_exec(repo, agent)
    reasons = res.reasons("limits")
    assert "the largest file, 'big.txt', has 1200 bytes; the limit is 1000" in reasons
    assert "the run added 1804 bytes; the limit is 1500" in reasons
    assert "the run changed 4 files; the limit is 2" in reasons
    assert "the run made 2 commits; the limit is 1" in reasons


def test_within_limits_passes(repo: Path, tmp_path: Path) -> None:
    (repo / ".ccm-guard.toml").write_text("[roles.implementor.limits]\nmax_files = 5\n")
    commit_all(repo)
    res = run_exec(repo, write_agent(tmp_path, "echo a > a.txt; git add -A; git commit -qm a"))
    assert res.code == 0 and res.status("limits") == "pass"


# --- outside exec ------------------------------------------------------------------------------


def test_check_paths_staged_and_range(repo: Path) -> None:
    (repo / "tests").mkdir()
    (repo / "tests/test_a.py").write_text("x\n")
    (repo / "src/app.py").write_text("changed\n")
    git(repo, "add", "-A")
    staged = ccm("check-paths", "--role", "test-writer", cwd=repo)
    assert staged.returncode == 1
    assert staged.stdout.strip() == "src/app.py: changed, but not in the role's allow list (staged)"
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "-m", "mixed")
    ranged = ccm("check-paths", "--role", "test-writer", f"{base}..HEAD", "--json", cwd=repo)
    assert ranged.returncode == 1
    assert [v["path"] for v in json.loads(ranged.stdout)["violations"]] == ["src/app.py"]
    assert ccm("check-paths", "--role", "implementor", f"{base}..HEAD", cwd=repo).returncode == 0
    bad = ccm("check-paths", "nonsense", cwd=repo)
    assert bad.returncode == 2 and "BASE..HEAD" in bad.stderr


def test_check_staged_api_for_hooks(repo: Path) -> None:
    (repo / ".gitattributes").write_text("* text\n")
    git(repo, "add", "-A")
    assert check_staged(repo, None) == [
        ".gitattributes: changed, but forbidden by '**/.gitattributes' (staged)"]
