"""The harness itself: each real agent CLI, run bare (no ccm-guard) in a git repository on
a fresh HOME and driven by a scripted model on loopback, edits a file and commits it.

Claude Code, Codex and Gemini CLI commit through their own shell tool (`git add`,
`git commit`); aider applies a SEARCH/REPLACE edit and auto-commits it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from agent_harness import (  # noqa: F401  (fixtures)
    AgentRun,
    Agents,
    agents,
    aider_run,
    claude_run,
    codex_run,
    fresh_home,
    gemini_run,
    make_lived_home,
    model,
    run_agent,
)
from models import COMMIT_MESSAGE, ModelServer, Say, Shell, Step

COMMIT = ("printf 'hello from the agent\\n' > hello.txt && git add hello.txt"
          " && git commit -q -m 'Add hello' && git log -1 --format=subject:%s")


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()


def _check_shell_commit(run: AgentRun, model: ModelServer, repo: Path) -> None:
    base = _git(repo, "rev-parse", "HEAD")
    proc = run_agent(run, repo)
    context = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\nrequests:\n{model.summary()}"
    assert proc.returncode == 0, context
    assert not model.errors, context
    assert _git(repo, "log", "-1", "--format=%s") == "Add hello", context
    assert _git(repo, "rev-parse", "HEAD~1") == base, context
    assert _git(repo, "show", "HEAD:hello.txt") == "hello from the agent"
    # The agent ran our command, and sent its output back to the model.
    outputs = model.tool_outputs()
    assert len(outputs) == 1 and "subject:Add hello" in outputs[0], context
    assert [r.step for r in model.main_requests()] == [0, 1], context
    assert "Done with the commit." in proc.stdout, context


SCRIPT: list[Step] = [Shell(COMMIT), Say("Done with the commit.")]


def test_claude_commits_with_its_bash_tool(agents: Agents, model: ModelServer, repo: Path,
                                           fresh_home: Path) -> None:
    model.script = list(SCRIPT)
    _check_shell_commit(claude_run(agents, model, "Add hello.txt and commit it."), model, repo)
    first = model.main_requests("anthropic")[0]
    assert first.path == "/v1/messages" and "Bash" in [t["name"] for t in first.body["tools"]]
    assert _git(repo, "status", "--porcelain") == ""
    assert (fresh_home / ".claude.json").exists()  # Claude Code keeps its state in HOME


def test_codex_commits_with_its_shell_tool(agents: Agents, model: ModelServer, repo: Path,
                                           fresh_home: Path) -> None:
    model.script = list(SCRIPT)
    _check_shell_commit(codex_run(agents, model, "Add hello.txt and commit it."), model, repo)
    assert model.main_requests("responses")[0].path == "/v1/responses"
    assert _git(repo, "status", "--porcelain") == ""
    assert (fresh_home / ".codex").is_dir()


def test_gemini_commits_with_its_shell_tool(agents: Agents, model: ModelServer, repo: Path,
                                            fresh_home: Path) -> None:
    model.script = list(SCRIPT)
    run = gemini_run(agents, model, "Add hello.txt and commit it.", home=fresh_home,
                     trusted=[repo])
    _check_shell_commit(run, model, repo)
    assert _git(repo, "status", "--porcelain") == ""


def test_aider_applies_an_edit_and_auto_commits(agents: Agents, model: ModelServer,
                                                repo: Path) -> None:
    edit = ("README.md\n```\n<<<<<<< SEARCH\n# project\n=======\n# project\n\n"
            "Edited by aider.\n>>>>>>> REPLACE\n```\n")
    model.script = [Say(edit)]
    base = _git(repo, "rev-parse", "HEAD")
    proc = run_agent(aider_run(agents, model, "Add a line to README.md.", ["README.md"]), repo)
    context = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}\nrequests:\n{model.summary()}"
    assert proc.returncode == 0, context
    assert not model.errors, context
    assert _git(repo, "rev-parse", "HEAD~1") == base, context
    assert _git(repo, "log", "-1", "--format=%s") == COMMIT_MESSAGE, context
    assert _git(repo, "show", "HEAD:README.md") == "# project\n\nEdited by aider."
    assert len(model.main_requests("chat")) == 1, context
    # aider's own files: history and tags cache in the repository, .aider* in .gitignore.
    assert (repo / ".aider.chat.history.md").exists()
    assert ".aider*" in (repo / ".gitignore").read_text()


@pytest.mark.parametrize("agent", ["claude", "codex"])
def test_agents_work_on_a_lived_in_home(agent: str, agents: Agents, model: ModelServer,
                                        repo: Path, fresh_home: Path) -> None:
    """Existing settings, trust lists and credentials in HOME do not get in the way; the
    model endpoint still comes from the environment/command line."""
    make_lived_home(fresh_home, trusted=[repo])
    model.script = list(SCRIPT)
    build = claude_run if agent == "claude" else codex_run
    _check_shell_commit(build(agents, model, "Add hello.txt and commit it."), model, repo)
    assert _git(repo, "log", "-1", "--format=%an") == "Lived Person"
