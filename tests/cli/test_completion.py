"""Shell completion of task ids and role names (click's completion protocol, as the
shell scripts README shows how to enable call it)."""

from __future__ import annotations

from pathlib import Path

from conftest import ccm, git, run_exec, write_agent


def _complete(repo: Path, words: str) -> list[str]:
    proc = ccm(cwd=repo, env={"_CCM_GUARD_COMPLETE": "bash_complete", "COMP_WORDS": words,
                              "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return [line.split(",", 1)[1] for line in proc.stdout.splitlines()]


def test_task_ids_and_roles_complete(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, "echo x > a.txt\ngit add a.txt\ngit commit -q -m a")
    for task in ("fix-login", "fix-logout", "docs"):
        assert run_exec(repo, agent, "--task", task).code == 0
    (repo / ".ccm-guard.toml").write_text('[roles.docs-writer]\nallow = ["docs/"]\n')
    git(repo, "add", ".ccm-guard.toml")
    git(repo, "commit", "-q", "-m", "policy")
    assert sorted(_complete(repo, "ccm-guard task show fix")) == ["fix-login", "fix-logout"]
    assert _complete(repo, "ccm-guard audit do") == ["docs"]
    assert _complete(repo, "ccm-guard exec --role do") == ["docs-writer"]
    assert "test-writer" in _complete(repo, "ccm-guard verify --role ")
