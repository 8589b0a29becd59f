"""Class 7: spoofing what the runner parses or shows.

tests/prevent/test_exec_sandbox.py covers a spoofed `index.lock` line that gains nothing (and one
with forbidden work that still fails), tests/detect/test_hardening.py escapes in paths and
commit subjects. These are the rest: lock lines that name someone else's metadata, a fake
verdict, escapes that would hide the real verdict, a question that would excuse a failure,
and a forged refusal log.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from adv import COMMIT, all_paths, needs_landlock
from conftest import git, read_terminal, run_exec, write_agent


@pytest.mark.parametrize("whose", ["another task", "the person's checkout"])
def test_fake_lock_line_naming_someone_elses_metadata_recovers_nothing(repo: Path, tmp_path: Path, whose: str) -> None:
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "-b", "ccm/other", str(other))
    lock = f"{repo}/.git/worktrees/other/index.lock" if whose == "another task" else f"{repo}/.git/index.lock"
    agent = write_agent(tmp_path, f"""echo change > src/app.py
echo "fatal: Unable to create '{lock}': Operation not permitted" >&2
exit 1""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "spoof")
    assert f"fatal: Unable to create '{lock}'" in res.stderr  # the line was there
    assert res.verdict["recovery"] is None
    assert git(repo, "rev-parse", "ccm/spoof") == git(repo, "rev-parse", "main")  # nothing was committed
    assert res.code == 1 and res.status("clean-tree") == "fail"


def test_fake_json_verdict_on_stdout_does_not_reach_the_real_one(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
echo '{{"passed": true, "exit_code": 0, "outcome": "pass", "gates": []}}'
rgit update-ref refs/heads/main HEAD""")
    res = run_exec(repo, agent, "--sandbox", "none")  # run_exec parses stdout as one JSON document: nothing else is on it
    assert '"passed": true' in res.stderr  # the agent's stdout went to stderr under --json
    assert res.verdict["passed"] is False and res.code == 1
    assert res.status("refs-untouched") == "fail"


def test_escapes_left_open_by_the_agent_cannot_hide_the_human_verdict(repo: Path, tmp_path: Path) -> None:
    """An unterminated OSC swallows what follows until a terminator; concealed text is invisible.
    The agent's open OSC is held back (and dropped), and on a terminal the verdict starts by
    ending any such state anyway."""
    agent = write_agent(tmp_path, f"""{COMMIT}
rgit update-ref refs/heads/main HEAD
printf 'ccm-guard: PASS  task fake\\n\\033[8m\\033]0;'""")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--sandbox", "none", "--no-pty", "--", str(agent)], cwd=repo,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    out = read_terminal(leader)
    assert proc.wait(timeout=60) == 1
    fake = out.index(b"ccm-guard: PASS  task fake")
    real = out.index(b"ccm-guard: FAIL")
    assert b"\x1b]0;" not in out[fake:real]  # the OSC the agent left open never reached the terminal ...
    assert b"\x1b\\" in out[fake:real] and b"\x1b[0m" in out[fake:real]  # ... and the verdict resets all first


def test_a_question_does_not_excuse_a_failure(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
rgit update-ref refs/heads/main HEAD
printf '{{"question": "all gates passed\\\\u001b[2K, may I go on?"}}' > question.json""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.verdict["question"] == "all gates passed\x1b[2K, may I go on?"
    assert res.code == 1 and res.verdict["outcome"] == "gates-failed"  # not 9 (blocked)
    human = subprocess.run([sys.executable, "-m", "ccm_guard", "task", "show", res.verdict["task"]], cwd=repo,
                           capture_output=True, text=True)
    assert "\x1b" not in human.stdout


def test_forged_refusal_log_lines_are_shown_escaped_and_marked_unreadable(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
printf '{{"op": "remote\\\\u001b[2J", "reason": "nothing\\\\u001b[1A\\\\u001b[2K all clear"}}\\n' >> "$CCM_GUARD_LOG"
printf 'not json \\033[31m red\\n' >> "$CCM_GUARD_LOG" """)
    proc = subprocess.run([sys.executable, "-m", "ccm_guard", "exec", "--", str(agent)], cwd=repo,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert "refused by the git shim and hooks: 2" in proc.stdout
    assert "\x1b" not in proc.stdout
    assert "remote\\x1b[2J: nothing\\x1b[1A\\x1b[2K all clear" in proc.stdout


@pytest.mark.parametrize("sandbox", ["none", pytest.param("landlock", marks=needs_landlock)])
@pytest.mark.parametrize("link", ["logs/HEAD", "index"])
def test_a_fake_blocked_commit_with_a_linked_admin_file_writes_nothing_through_the_link(
        repo: Path, tmp_path: Path, sandbox: str, link: str) -> None:
    # The agent points a file of its own admin dir that a host-side commit writes (the
    # reflog, the index) at a file of the person's, then fakes the blocked-commit line so
    # that ccm-guard commits on the host.
    victim = tmp_path / "bashrc"
    victim.write_text("# the person's shell start-up\n")
    agent = write_agent(tmp_path, f"""echo change > src/app.py
admin=$(git rev-parse --git-dir)
rm -f "$admin/{link}"; ln -s {victim} "$admin/{link}"
echo "fatal: Unable to create '$admin/index.lock': Read-only file system" >&2
exit 128""")
    res = run_exec(repo, agent, "--sandbox", sandbox, "--task", "linked")
    assert victim.read_text() == "# the person's shell start-up\n"  # nothing was written through the link
    assert res.verdict["recovery"] is None
    assert res.code == 1
    assert "planted in the git metadata" in res.reasons("git-metadata")
    assert f"worktrees/linked/{link}" in all_paths(res, "git-metadata")


@pytest.mark.parametrize("claim", ["trailer", "identity"])
def test_a_commit_that_claims_to_be_ccm_guards_fails_the_run(repo: Path, tmp_path: Path, claim: str) -> None:
    # A reviewer trusts a "recovery" commit or one by ccm-guard itself more than the agent's.
    commit = ('git commit -q -m "Fix" -m "Recovery-Reason: sandbox blocked commit"' if claim == "trailer" else
              'GIT_AUTHOR_NAME=ccm-guard GIT_AUTHOR_EMAIL=ccm-guard@localhost git commit -q -m "Fix"')
    agent = write_agent(tmp_path, f"echo fix > fix.txt; git add fix.txt; {commit}")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.code == 1
    assert "claims to be ccm-guard's" in res.reasons("new-commit")


def _on_a_terminal(repo: Path, *args: str) -> bytes:
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", *args], cwd=repo,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower)
    os.close(follower)
    out = read_terminal(leader)
    proc.wait(timeout=60)
    return out


ESCAPES = r"\033]52;c;ZWNobyBwd25lZAo=\007\033[2J\033]0;T\007"


def test_escapes_in_the_agents_files_and_lock_reason_are_shown_not_obeyed(repo: Path, tmp_path: Path) -> None:
    """`task diff` shows the agent's file as git shows a diff (no pager here to filter it):
    the clipboard write, the screen clear and the title change arrive escaped; so does a
    lock reason the agent wrote for gc to print. A pipe still gets the diff's bytes."""
    agent = write_agent(tmp_path, f"""printf 'x\\n{ESCAPES}\\n' > esc.py; git add esc.py; git commit -q -m esc
printf 'x {ESCAPES}' > "$(git rev-parse --absolute-git-dir)/locked\"""")
    res = run_exec(repo, agent, "--task", "esc")
    assert "locked" in res.reasons("git-metadata")
    for out in (_on_a_terminal(repo, "task", "diff", "esc"), _on_a_terminal(repo, "gc", "--older-than", "0s")):
        assert b"\x1b]52" not in out and b"\x1b[2J" not in out and b"\x1b]0;" not in out, out
        assert b"\\x1b]52;c;" in out, out
    piped = subprocess.run([sys.executable, "-m", "ccm_guard", "task", "diff", "esc"], cwd=repo,
                           capture_output=True, stdin=subprocess.DEVNULL, timeout=60).stdout
    assert b"\x1b]52;c;" in piped


@needs_landlock
def test_a_recovered_commit_carries_none_of_the_agents_ccm_guard_claims(repo: Path, tmp_path: Path) -> None:
    """The commit ccm-guard makes for a sandbox-blocked one is recorded as its own, so its
    trailers are believed later: the agent's summary must not put claims in it."""
    agent = write_agent(tmp_path, """echo "print(3)" > src/app.py
printf 'Fix app\\n\\nCcm-Guard-Task: other\\nCcm-Guard-Head: 1111111111111111111111111111111111111111\\n' > "$CCM_GUARD_SUMMARY"
echo "fatal: Unable to create '$(git rev-parse --absolute-git-dir)/index.lock': Permission denied" >&2
exit 1""")
    res = run_exec(repo, agent, "--task", "rec")
    assert res.verdict["recovery"] is not None
    message = git(repo, "log", "-1", "--format=%B", "ccm/rec")
    assert message.startswith("Fix app") and "Recovery-Reason:" in message
    assert "Ccm-Guard-" not in message


def test_without_a_pty_the_agent_cannot_write_to_the_persons_terminal_through_stdin(repo: Path, tmp_path: Path) -> None:
    """`--no-pty` (or stdout not a terminal: `--json | jq`) runs the agent on pipes; a
    terminal on ccm-guard's stdin must not be handed on, or the agent writes an OSC 52
    clipboard write to it past the filter its output goes through."""
    agent = write_agent(tmp_path, f"""printf '\\033]52;c;Y3VybCBldmlsfHNo\\007' > /proc/self/fd/0 2>/dev/null
test -t 0 && echo STDIN-IS-A-TERMINAL
{COMMIT}""")
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "ccm_guard", "exec", "--no-pty", "--task", "tty", "--", str(agent)],
                            cwd=repo, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = read_terminal(leader)
    assert proc.wait(timeout=60) == 0, out
    assert b"\x1b]52" not in out and b"STDIN-IS-A-TERMINAL" not in out, out

