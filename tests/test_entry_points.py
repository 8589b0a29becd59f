"""Names that code outside this checkout imports, kept working across the package's layout.

Guard hooks installed by earlier versions live on in people's repositories and import
`ccm_guard.hookrun`; the pool's detached refiller imports `ccm_guard.pool` by name; and
`--help` prints the exit-code table made from ExitCode. And what the entry points do
on the way in and out: `run` leaves without the interpreter's teardown, and importing
the command line raises the collector's threshold before anything else.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, ccm, git

from ccm_guard.errors import EXIT_CODE_TABLE, ExitCode
from ccm_guard.prevent.hooks import install_worktree
from ccm_guard.prevent.resources import data_file


def test_installed_hooks_import_the_stable_entry_name() -> None:
    template = data_file("hooks", "hook.sh").read_text()
    assert "from ccm_guard.hookrun import cli" in template


def test_a_hook_of_the_previous_layout_runs_and_refuses(repo: Path) -> None:
    """A task's pre-commit hook, whose entry line is the one the flat layout wrote, run by
    git on a commit the policy forbids: the stable name still reaches the checker."""
    wt = repo.parent / "wt-t1"
    git(repo, "worktree", "add", "-q", "-b", "ccm/t1", str(wt))
    install_worktree(wt, task="t1", branch="ccm/t1", role="implementor", log=repo.parent / "refusals.jsonl")
    hooks = Path(git(wt, "rev-parse", "--path-format=absolute", "--git-path", "hooks"))
    assert "from ccm_guard.hookrun import cli" in (hooks / "pre-commit").read_text()
    (wt / ".gitattributes").write_text("* text=auto\n")
    git(wt, "add", ".gitattributes")
    proc = subprocess.run(["git", "commit", "-qm", "touch a control path"], cwd=wt, capture_output=True, text=True)
    assert proc.returncode != 0 and "ccm-guard: refused: .gitattributes" in proc.stderr


def test_the_refiller_entry_name_resolves() -> None:
    code = "import sys; sys.path.insert(0, sys.argv[1]); from ccm_guard import pool; print(callable(pool.refill))"
    out = subprocess.run([sys.executable, "-c", code, str(ROOT)], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == "True", out.stderr


def test_the_exit_code_table_lists_every_code() -> None:
    from ccm_guard.warm.client import KILLED

    assert KILLED == ExitCode.SERVER_GONE  # the client cannot import the table: it holds the code itself
    for code in ExitCode:
        assert f"  {int(code):<4} {code.text.split()[0]}" in EXIT_CODE_TABLE
    helped = ccm("--help", cwd=ROOT).stdout
    assert all(f"{int(code):<4} " in helped for code in ExitCode)


def test_the_installed_command_is_run() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'ccm-guard = "ccm_guard.__main__:main"' in text
    assert "from ccm_guard.cli import run" in (ROOT / "ccm_guard" / "__main__.py").read_text()


_LEAVING = """
import atexit, sys, threading, time
import click
from ccm_guard import cli

out = sys.argv.pop()

def late():
    time.sleep(0.3)
    open(out + "/thread", "w").write("finished")

@click.command()
def command():
    threading.Thread(target=late).start()
    atexit.register(lambda: open(out + "/handler", "w").write("ran"))
    click.echo("x" * 300000)
    click.echo("the last line", err=True)
    sys.exit(7)

cli.main = command
cli.run()
"""


def test_leaving_without_the_teardown_loses_nothing(tmp_path: Path) -> None:
    """`run` ends the process without the interpreter's teardown: all the command
    printed still arrives through pipes, its exit code is kept, a thread it started
    finishes and its exit handlers run."""
    proc = subprocess.run([sys.executable, "-c", _LEAVING, str(tmp_path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 7, proc.stderr
    assert proc.stdout == "x" * 300000 + "\n"
    assert proc.stderr == "the last line\n"
    assert (tmp_path / "thread").read_text() == "finished"
    assert (tmp_path / "handler").read_text() == "ran"


_COLLECTIONS = """
import gc
gc.collect()  # the interpreter's own start counted out
passes = []
gc.callbacks.append(lambda phase, info: passes.append(info["generation"]) if phase == "stop" else None)
import ccm_guard.cli, ccm_guard.cli.exec, ccm_guard.run.exec, ccm_guard.run.judge, ccm_guard.run.dispose
print(len(passes), gc.get_threshold()[0], gc.isenabled())
"""


def test_starting_a_command_sets_off_no_collection() -> None:
    """What a command's start makes lives to its end: importing everything an exec
    imports sets off at most the one collector pass that reading the command line's own
    module, before its first line raises the threshold, can (the default threshold:
    some 30 passes). The collector stays on: cycles are still collected, less often."""
    proc = subprocess.run([sys.executable, "-c", _COLLECTIONS], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    passes, threshold, enabled = proc.stdout.split()
    assert int(passes) <= 1
    assert enabled == "True" and int(threshold) == 100_000  # raised, not switched off


_CLIENT_IMPORTS = """
import sys
before = set(sys.modules)
from ccm_guard.__main__ import main
from ccm_guard.warm.client import through_server
print(through_server())
print(" ".join(sorted(set(sys.modules) - before)))
"""


def test_the_command_asks_for_a_warm_server_with_built_in_modules_only(tmp_path: Path) -> None:
    """The installed command's first step, with no server: it must not load click or any
    of the standard library's Python modules, which is what the server saves."""
    proc = subprocess.run([sys.executable, "-c", _CLIENT_IMPORTS], cwd=tmp_path, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, start_new_session=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    answer, loaded = proc.stdout.splitlines()
    assert answer == "None", proc.stderr  # no server for this state home: the command runs here
    assert set(loaded.split()) - {"ccm_guard", "ccm_guard.__main__", "ccm_guard.warm", "ccm_guard.warm.client"} \
        <= {"_socket", "_sha256", "_signal"}, loaded
    assert "_socket" in loaded.split()  # it did look: no terminal, and nothing set it off


def test_every_package_is_in_the_wheel() -> None:
    """pyproject lists the packages by name: one left out installs a command that cannot
    import itself (the source checkout's tests would never notice)."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "ccm_guard").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
