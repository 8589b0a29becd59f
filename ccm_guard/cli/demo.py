"""`ccm-guard demo`: a throwaway repository and two scripted agents, one good and one not."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import click

from ccm_guard.cli.options import CONTEXT, handled

GOOD_AGENT = """#!/bin/sh
# A well-behaved agent: edits a file and commits it.
set -e
printf 'def greet(name):\\n    return f"Hello, {name}!"\\n' > greet.py
git add greet.py
git -c user.name="Demo Agent" -c user.email=agent@example.com commit -q -m "Add greet()"
echo "agent: committed greet.py"
"""

BAD_AGENT = """#!/bin/sh
# A misbehaving agent: commits, but leaves work uncommitted and tries to plant a hook in
# the shared .git/hooks (code that would run on your next commit).
echo "print('more')" >> greet.py
git add greet.py
git -c user.name="Demo Agent" -c user.email=agent@example.com commit -q -m "Tweak greet"
echo "half-finished" > notes.txt
common=$(git rev-parse --git-common-dir)
if printf '#!/bin/sh\\necho pwned\\n' 2>/dev/null > "$common/hooks/pre-commit"; then
    chmod +x "$common/hooks/pre-commit"
    echo "agent: planted a hook in $common/hooks"
else
    echo "agent: could not write $common/hooks/pre-commit (the sandbox refused)"
fi
"""


def _make_repo(root: Path) -> Path:
    from ccm_guard import git

    repo = root / "project"
    repo.mkdir()
    identity = {"GIT_AUTHOR_NAME": "Demo", "GIT_AUTHOR_EMAIL": "demo@example.com",
                "GIT_COMMITTER_NAME": "Demo", "GIT_COMMITTER_EMAIL": "demo@example.com"}
    (repo / "README.md").write_text("# demo project\n")
    (repo / "app.py").write_text("print('hello')\n")
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", "Initial commit"]):
        git.run(args, cwd=repo, env=identity)
    for name, text in (("good-agent.sh", GOOD_AGENT), ("bad-agent.sh", BAD_AGENT)):
        path = root / name
        path.write_text(text)
        path.chmod(0o755)
    return repo


def run_demo(keep: bool) -> int:
    # Imported here, not at the top: every ccm-guard command imports this module.
    from ccm_guard.agent.options import ExecOptions
    from ccm_guard.cli.render import render
    from ccm_guard.run.tasks import execute
    from ccm_guard.state.registry import Registry

    root = Path(tempfile.mkdtemp(prefix="ccm-guard-demo-"))
    previous_home = os.environ.get("CCM_GUARD_HOME")
    os.environ["CCM_GUARD_HOME"] = str(root / "state")  # never the person's ~/.ccm
    try:
        repo = _make_repo(root)
        registry = Registry()
        outcomes = []
        for label, script, task in (("a well-behaved agent", "good-agent.sh", "demo-good"),
                                    ("a misbehaving agent", "bad-agent.sh", "demo-bad")):
            click.secho(f"\n=== ccm-guard exec -- ./{script}   ({label}) ===", bold=True)
            verdict = execute(ExecOptions(command=[str(root / script)], start=repo, task=task, terminal=False),
                                registry)
            click.echo(render(verdict, places=keep))  # without --keep, nothing it names will be left
            outcomes.append(int(verdict.exit_code))
        expected = outcomes[0] == 0 and outcomes[1] != 0
        click.secho(
            "\ndemo: the good agent passed and the bad one was caught." if expected
            else f"\ndemo: unexpected outcome {outcomes}: please report this.", fg="green" if expected else "red")
        if keep:
            click.echo(f"\nThe demo's repository, tasks and logs are kept in {root}. The next steps above work "
                       f"after:\n  export CCM_GUARD_HOME={root / 'state'}; cd {repo}")
        else:
            click.echo("\n(`ccm-guard demo --keep` keeps the demo's repository and tasks to look around.)")
        click.echo("Try it on your own repository:\n  cd YOUR-REPO && ccm-guard exec -- claude -p \"fix the failing test\""
                   "   # or any agent command")
        return 0 if expected else 1
    finally:
        if previous_home is None:
            os.environ.pop("CCM_GUARD_HOME", None)
        else:
            os.environ["CCM_GUARD_HOME"] = previous_home
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


@click.command(context_settings=CONTEXT)
@click.option("--keep", is_flag=True, help="Keep the throwaway repository and print where it is.")
@handled
def demo(keep: bool) -> None:
    """Make a throwaway repository and run two scripted agents through exec.

    Both run with exec's default options, sandboxed where the kernel has Landlock. The
    first agent edits a file and commits: it passes. The second also commits, but tries
    to plant a hook in .git/hooks (the sandbox refuses the write; unsandboxed, the
    git-metadata gate catches the hook and moves it aside) and leaves a file uncommitted
    (clean-tree catches it). Your own repositories and ~/.ccm are not touched.
    """
    sys.exit(run_demo(keep))
