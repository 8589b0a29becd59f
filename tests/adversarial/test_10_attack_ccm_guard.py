"""Class 10: attacking ccm-guard itself: its state home, its shim and hooks, the variables
it reads, the policy, and names built to inject shell.

exec judges from the baseline it keeps in memory, and its hooks take their settings from
a path baked into them, so what an unsandboxed agent rewrites under the state home does
not change the run's own verdict; what would mislead a later command is stated below.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from adv import COMMIT, SANDBOXES, all_paths, refusals
from conftest import ccm, git, make_repo, run_exec, write_agent

MOVE_MAIN = "git update-ref refs/heads/main HEAD || true"


def test_a_replaced_shim_still_meets_the_hooks(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
shim=$(command -v git); printf '#!/bin/sh\\nexec "$CCM_GUARD_REAL_GIT" "$@"\\n' > "$shim"
{MOVE_MAIN}""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main
    assert [r.get("hook") for r in refusals(res)] == ["reference-transaction"]  # the shim said nothing: it was gone
    assert res.code == 0


def test_a_forged_allow_list_in_the_environment_still_meets_the_hooks(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\nCCM_GUARD_ALLOW='ref-write config-write' {MOVE_MAIN}")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == main
    assert [r.get("hook") for r in refusals(res)] == ["reference-transaction"]


def test_the_shim_pointed_at_itself_fails_closed(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
CCM_GUARD_REAL_GIT=$(command -v git) git status 2> "$TMPDIR/err" && echo RAN >&2
cat "$TMPDIR/err" >&2""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert "RAN" not in res.stderr and "real git not found" in res.stderr


def test_rewritten_hook_settings_are_reported(repo: Path, tmp_path: Path) -> None:
    """The agent widens what its reference-transaction hook allows, then moves main."""
    before = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
echo 'allow_ref=refs/heads/' >> "$(git config --get core.hooksPath)/settings"
"$CCM_GUARD_REAL_GIT" update-ref refs/heads/main HEAD""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == res.verdict["head"] != before  # the hook let it through
    assert res.code == 1
    assert "refs/heads/main moved" in res.reasons("refs-untouched")
    assert any(p.endswith("/settings") for p in all_paths(res, "git-metadata"))


def test_the_users_policy_under_the_state_home_is_watched(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
printf '[roles.implementor]\\nforbid = []\\n' > "$(dirname "$(dirname "$(dirname "$CCM_GUARD_SUMMARY")")")/../../policy.toml" """)
    res = run_exec(repo, agent, "--sandbox", "none")
    policy = Path(os.environ["CCM_GUARD_HOME"], "policy.toml")
    assert policy.exists()
    assert res.code == 1 and f"{policy} was added" in res.reasons("git-metadata")
    # It takes effect: the next run's implementor may change the control paths.
    nxt = run_exec(repo, write_agent(tmp_path, "echo '* filter=x' > .gitattributes; git add -A; git commit -q -m a",
                                     "next.sh"), "--sandbox", "none")
    assert nxt.status("path-policy") == "pass"


def test_the_policy_table_in_pyproject_is_the_policy(repo: Path, tmp_path: Path) -> None:
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.ccm-guard.roles.implementor]\nforbid = ["**/.git*"]\n')
    git(repo, "add", "pyproject.toml")
    git(repo, "commit", "-q", "-m", "policy")
    agent = write_agent(tmp_path, """python3 - <<'PY'
text = open("pyproject.toml").read().replace('forbid = ["**/.git*"]', 'forbid = []')
open("pyproject.toml", "w").write(text + '\\n[project.optional-dependencies]\\ndev = ["pytest"]\\n')
PY
git commit -q -am 'add dev dependencies'""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "pyp")
    assert "forbid = []" in git(repo, "show", "ccm/pyp:pyproject.toml")
    assert res.code == 1
    assert "pyproject.toml: its [tool.ccm-guard] table, the repository's policy, was changed" in res.reasons("path-policy")


def test_editing_pyproject_elsewhere_is_fine(repo: Path, tmp_path: Path) -> None:
    (repo / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.ccm-guard]\ndefault_role = "implementor"\n')
    git(repo, "add", "pyproject.toml")
    git(repo, "commit", "-q", "-m", "policy")
    agent = write_agent(tmp_path, """printf '\\n[tool.ruff]\\nline-length = 100\\n' >> pyproject.toml
git commit -q -am 'ruff settings'""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.code == 0 and res.status("path-policy") == "pass"


REWRITE_BASELINE = f"""{COMMIT}
rgit update-ref refs/heads/main HEAD 2>/dev/null || echo MAIN-DENIED >&2
log=$(dirname "$(dirname "$CCM_GUARD_SUMMARY")")
python3 - "$log/baseline.json" "$(git rev-parse HEAD)" <<'PY' 2>/dev/null || echo DENIED >&2
import json, sys
data = json.load(open(sys.argv[1]))
data["snapshot"]["refs"]["refs/heads/main"] = sys.argv[2]
json.dump(data, open(sys.argv[1], "w"))
PY"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_rewritten_baseline_does_not_mislead_the_run_itself(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """exec judges from the snapshot it holds in memory; Landlock keeps the agent out of the state home."""
    res = run_exec(repo, write_agent(tmp_path, REWRITE_BASELINE), "--sandbox", sandbox, "--task", "base")
    baseline = json.loads(Path(res.verdict["log_dir"], "baseline.json").read_text())
    if sandbox == "landlock":  # neither main nor the state home can be written
        assert "MAIN-DENIED" in res.stderr and "\nDENIED" in "\n" + res.stderr
        assert baseline["snapshot"]["refs"]["refs/heads/main"] != res.verdict["head"]
        assert res.code == 0
    else:
        assert baseline["snapshot"]["refs"]["refs/heads/main"] == res.verdict["head"]  # it was rewritten
        assert res.code == 1 and "refs/heads/main moved" in res.reasons("refs-untouched")  # and misled nothing


def test_a_rewritten_baseline_does_not_mislead_a_later_audit(repo: Path, tmp_path: Path) -> None:
    """Found by this suite: audit trusted the rewritten file. Its digest is in the registry now."""
    run_exec(repo, write_agent(tmp_path, REWRITE_BASELINE), "--sandbox", "none", "--task", "base")
    audit = ccm("audit", "--json", "base", cwd=repo)
    assert audit.returncode == 7 and "was changed after it was recorded" in audit.stderr


def test_the_refusal_log_is_the_agents_to_erase(repo: Path, tmp_path: Path) -> None:
    """A stated limitation: refusals are logged where the agent can write (its private dir),
    so the list in the verdict is a courtesy; the gates do not depend on it."""
    agent = write_agent(tmp_path, f"""{COMMIT}
git push origin HEAD 2> "$TMPDIR/err" || true
cat "$TMPDIR/err" >&2
: > "$CCM_GUARD_LOG" """)
    res = run_exec(repo, agent, "--sandbox", "none")
    assert "ccm-guard: refused: git push talks to remotes" in res.stderr  # the refusal happened ...
    assert refusals(res) == []  # ... and is gone from the verdict
    assert res.code == 0


def test_shell_metacharacters_in_the_state_home_and_the_task_id_inject_nothing(tmp_path: Path) -> None:
    home = tmp_path / "st a'te \"$(touch pwned1)\" `touch pwned2`"
    repo = make_repo(tmp_path / "repo")
    agent = write_agent(tmp_path, """echo '* filter=x' > .gitattributes; git add .gitattributes
git commit -q -m attrs || true; git reset -q; rm .gitattributes
echo work > work.txt; git add work.txt; git commit -q -m work""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "x$(touch pwned3);`touch pwned4`", env={"CCM_GUARD_HOME": str(home)})
    assert res.code == 0, res.stdout
    assert res.verdict["task"] == "x-touch-pwned3-touch-pwned4"
    assert res.verdict["worktree"].startswith(str(home))
    assert [r["op"] for r in refusals(res)] == ["path-policy"]  # the hooks, baked with that path, ran and refused
    for where in (tmp_path, repo, Path(res.verdict["worktree"]), Path.cwd()):
        assert not list(where.glob("pwned*"))


PLANT_IN_POOL = """{commit}
for entry in "$HOME_DIR"/pool/*/p-*; do
  [ -d "$entry" ] || continue
  if echo 'print("planted")' > "$entry/src_planted.py" 2>/dev/null; then echo PLANTED >&2; else echo DENIED >&2; fi
  echo 'evil' >> "$entry/README.md" 2>/dev/null || true
done"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_files_planted_in_the_warm_pool_never_reach_the_next_task(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """While it runs, the agent writes into the ready worktrees the next task will be given."""
    home = Path(os.environ["CCM_GUARD_HOME"])
    assert ccm("pool", "fill", "-n", "2", "--no-refill", cwd=repo).returncode == 0
    agent = write_agent(tmp_path, PLANT_IN_POOL.format(commit=COMMIT).replace("$HOME_DIR", str(home)))
    res = run_exec(repo, agent, "--sandbox", sandbox, "--task", "planter")
    assert res.code == 0, res.stderr
    (entry,) = [e for e in json.loads(ccm("pool", "status", "--json", cwd=repo).stdout)["pools"][0]["entries"]
                if e["state"] == "ready"]
    planted = Path(entry["path"], "src_planted.py")
    if sandbox == "landlock":
        assert "DENIED" in res.stderr and "PLANTED" not in res.stderr and not planted.exists()
    else:
        assert "PLANTED" in res.stderr and planted.exists()
    check = write_agent(tmp_path, "test ! -e src_planted.py && ! grep -q evil README.md\n" + COMMIT, name="check.sh")
    nxt = run_exec(repo, check, "--sandbox", "none", "--task", "next")
    assert nxt.code == 0, nxt.stderr + json.dumps(nxt.verdict["gates"])
    if sandbox == "none":  # the planted entry was destroyed, never cleaned and handed out
        assert not Path(entry["path"]).exists()
        shown = json.loads(ccm("task", "show", "next", "--json", cwd=repo).stdout)
        assert "pooled" not in shown["options"]
