"""Installing and uninstalling the hooks: what is written where, and exactly undone.

Real repositories, real git; the pre-commit framework, husky and lefthook are the real
tools where this machine can install them (skipped, with the reason, where not).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import AUTHOR, git

from ccm_guard.errors import RepoError
from ccm_guard.prevent import hookfiles, hookreport
from ccm_guard.prevent import hooks as install

State = dict[str, tuple[str, int, bytes]]


def tree_state(directory: Path) -> State:
    """Every entry under `directory`: kind, mode and bytes (or a link's target)."""
    state: State = {}
    if not directory.exists():
        return state
    for path in sorted(directory.rglob("*")):
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            state[str(path.relative_to(directory))] = ("l", st.st_mode, os.readlink(path).encode())
        elif stat.S_ISDIR(st.st_mode):
            state[str(path.relative_to(directory))] = ("d", st.st_mode, b"")
        else:
            state[str(path.relative_to(directory))] = ("f", st.st_mode, path.read_bytes())
    return state


def write(path: Path, data: bytes | str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


def commit(cwd: Path, name: str, text: str = "x\n", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    write(cwd / name, text, 0o644)
    git(cwd, "add", "--", name)
    return subprocess.run(["git", "commit", "-q", "-m", f"add {name}"], cwd=cwd, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **AUTHOR, **(env or {})})


def add_worktree(repo: Path, name: str = "t1") -> Path:
    wt = repo.parent / f"wt-{name}"
    git(repo, "worktree", "add", "-q", "-b", f"ccm/{name}", str(wt))
    return wt


def install_task(wt: Path, name: str = "t1") -> hookreport.Report:
    return install.install_worktree(wt, task=name, branch=f"ccm/{name}", role="implementor",
                                    log=wt.parent / f"{name}.jsonl")


# --- one task worktree -----------------------------------------------------------------


def test_worktree_install_is_per_worktree_under_the_state_home(repo: Path, isolated: Path) -> None:
    wt = add_worktree(repo)
    report = install_task(wt)
    hooks = report.hooks_dir
    assert hooks is not None and hooks.is_relative_to(isolated / "state" / "hooks")
    assert git(repo, "config", "--get", "extensions.worktreeConfig") == "true"
    assert git(wt, "config", "--get", "core.hooksPath") == str(hooks)
    assert git(repo, "config", "--get", "core.hooksPath", check=False) == ""  # the main checkout
    assert sorted(p.name for p in hooks.iterdir()) == sorted(
        [*hookfiles.GUARD_HOOKS, "settings", "install.json"])
    settings = (hooks / "settings").read_text()
    assert "\nbranch=ccm/t1\n" in settings and "\nrole=implementor\n" in settings
    block = hookfiles.block_values(hooks / "pre-commit")
    assert block["HOOK"] == "pre-commit" and block["SETTINGS"] == str(hooks / "settings")
    assert block["LEGACY"] == str(repo.resolve() / ".git" / "hooks" / "pre-commit")


def test_hooks_run_the_resolved_interpreter_not_a_shim(repo: Path) -> None:
    report = install_task(add_worktree(repo))
    assert report.hooks_dir is not None
    python = hookfiles.block_values(report.hooks_dir / "pre-push")["PY"]
    assert os.path.isabs(python) and os.access(python, os.X_OK)
    assert "/shims/" not in python
    assert Path(python).read_bytes()[:2] != b"#!"  # a binary, not a wrapper script


def test_worktree_uninstall_restores_config_byte_for_byte(repo: Path) -> None:
    config_before = (repo / ".git/config").read_bytes()
    wt = add_worktree(repo)
    admin = Path(git(wt, "rev-parse", "--absolute-git-dir"))
    admin_before = tree_state(admin)
    report = install_task(wt)
    install_task(wt)  # installing twice changes nothing that uninstall cannot undo
    undone = install.uninstall_worktree(wt)
    assert (repo / ".git/config").read_bytes() == config_before
    assert tree_state(admin).keys() == admin_before.keys()  # config.worktree gone again
    assert report.hooks_dir is not None and not report.hooks_dir.exists()
    assert undone.removed and not undone.notes


def test_worktree_config_stays_while_another_task_needs_it(repo: Path) -> None:
    config_before = (repo / ".git/config").read_bytes()
    one, two = add_worktree(repo, "t1"), add_worktree(repo, "t2")
    install_task(one, "t1")
    install_task(two, "t2")
    install.uninstall_worktree(one)
    assert git(two, "config", "--get", "core.hooksPath").endswith("/worktrees/wt-t2")
    assert git(repo, "config", "--get", "extensions.worktreeConfig") == "true"
    install.uninstall_worktree(two)
    assert (repo / ".git/config").read_bytes() == config_before


def test_main_checkout_refused_as_a_task_worktree(repo: Path) -> None:
    with pytest.raises(RepoError, match="main checkout"):
        install_task(repo)


def test_worktree_install_chains_the_repositorys_hooks_path(repo: Path) -> None:
    write(repo / "tools/hooks/pre-commit", '#!/bin/sh\necho ran >> "$PWD/../ran-$(basename "$PWD")"\n')
    write(repo / "tools/hooks/post-commit", "#!/bin/sh\nexit 0\n")
    git(repo, "add", "tools")
    git(repo, "commit", "-q", "-m", "hooks")
    git(repo, "config", "core.hooksPath", "tools/hooks")  # relative: from each worktree's top
    wt = add_worktree(repo)
    report = install_task(wt)
    assert report.hooks_dir is not None
    assert (report.hooks_dir / "post-commit").exists()  # a chain-only script for it
    assert commit(wt, "a.txt").returncode == 0
    assert (wt.parent / "ran-wt-t1").read_text() == "ran\n"


# --- a whole repository ----------------------------------------------------------------


def existing_hooks(repo: Path) -> Path:
    hooks = repo / ".git/hooks"
    write(hooks / "pre-commit", "#!/bin/sh\nexit 0\n", 0o755)
    write(hooks / "commit-msg", b"#!/bin/sh\r\n# \xff not utf-8\r\nexit 0\r\n", 0o700)
    os.symlink("../../scripts/pre-push", hooks / "pre-push")  # relative, and dangling
    write(hooks / "post-commit", "#!/bin/sh\nexit 0\n", 0o750)
    write(hooks / "pre-commit.legacy", "#!/bin/sh\nexit 0\n", 0o755)  # the pre-commit framework's
    write(hooks / "pre-rebase.sample", "sample\n", 0o644)
    return hooks


def test_repo_install_uninstall_round_trip_is_byte_exact(repo: Path) -> None:
    hooks = existing_hooks(repo)
    before, config = tree_state(hooks), (repo / ".git/config").read_bytes()
    report = install.install_repo(repo)
    assert sorted(p.name for p, _ in report.kept) == ["commit-msg", "pre-commit", "pre-push"]
    for name in hookfiles.GUARD_HOOKS:
        assert hookfiles.is_ours(hooks / name)
    assert (hooks / f"pre-commit{install.LEGACY_SUFFIX}").read_text() == "#!/bin/sh\nexit 0\n"
    assert (hooks / "pre-commit.legacy").exists()  # never ours to touch
    install.install_repo(repo)  # again: ours are recognised, nothing kept twice
    assert not (hooks / f"pre-commit{install.LEGACY_SUFFIX}{install.LEGACY_SUFFIX}").exists()
    undone = install.uninstall_repo(repo)
    assert tree_state(hooks) == before
    assert (repo / ".git/config").read_bytes() == config
    assert sorted(p.name for p in undone.restored) == ["commit-msg", "pre-commit", "pre-push"]


def test_repo_install_creates_and_removes_a_missing_hooks_dir(repo: Path) -> None:
    assert not (repo / ".git/hooks").exists()  # GIT_TEMPLATE_DIR is empty in these tests
    install.install_repo(repo)
    assert hookfiles.is_ours(repo / ".git/hooks/pre-commit")
    install.uninstall_repo(repo)
    assert not (repo / ".git/hooks").exists()


def test_earlier_template_ids_are_recognised(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install.install_repo(repo)
    hook = repo / ".git/hooks/pre-commit"
    hook.write_text(hook.read_text().replace(hookfiles.HOOK_ID, "0123456789abcdef"))
    assert not hookfiles.is_ours(hook)
    monkeypatch.setattr(hookfiles, "PRIOR_IDS", ("0123456789abcdef",))
    assert hookfiles.is_ours(hook)
    install.install_repo(repo)  # upgraded in place, not kept as legacy
    assert not (repo / f".git/hooks/pre-commit{install.LEGACY_SUFFIX}").exists()


def test_a_taken_backup_name_is_refused_before_anything_changes(repo: Path) -> None:
    hooks = repo / ".git/hooks"
    write(hooks / "pre-commit", "#!/bin/sh\nexit 0\n")
    write(hooks / f"pre-commit{install.LEGACY_SUFFIX}", "#!/bin/sh\nexit 1\n")
    before = tree_state(hooks)
    with pytest.raises(RepoError, match="already exists"):
        install.install_repo(repo)
    assert tree_state(hooks) == before


def test_hooks_path_is_refused_with_the_remedies(repo: Path) -> None:
    git(repo, "config", "core.hooksPath", ".husky/_")
    config = (repo / ".git/config").read_bytes()
    with pytest.raises(RepoError) as refused:
        install.install_repo(repo)
    message = refused.value.message
    assert "\n" not in message and ".husky/_" in message
    for remedy in ("git config --unset core.hooksPath", "--worktree", "--force"):
        assert remedy in message
    assert (repo / ".git/config").read_bytes() == config
    assert not (repo / ".git/hooks").exists()


def test_force_chains_the_hooks_path_in_place_and_uninstall_restores_it(repo: Path) -> None:
    ran = repo.parent / "ran"
    write(repo / "githooks/pre-commit", f'#!/bin/sh\necho "$(basename "$0")" >> "{ran}"\n')
    git(repo, "config", "core.hooksPath", "githooks")
    config, hooks_before = (repo / ".git/config").read_bytes(), tree_state(repo / "githooks")
    report = install.install_repo(repo, force=True)
    assert git(repo, "config", "core.hooksPath") == str(report.hooks_dir)
    assert commit(repo, "a.txt").returncode == 0
    assert ran.read_text() == "pre-commit\n"  # run by its own path: $0 intact
    install.install_repo(repo, force=True)  # again: still chains githooks, not itself
    assert commit(repo, "b.txt").returncode == 0
    assert ran.read_text() == "pre-commit\n" * 2
    install.uninstall_repo(repo)
    assert (repo / ".git/config").read_bytes() == config
    assert tree_state(repo / "githooks") == hooks_before


def test_report_is_data(repo: Path) -> None:
    existing_hooks(repo)
    data = install.install_repo(repo).to_json()
    assert data["target"] == str(repo.resolve())
    assert sorted(was.rsplit("/", 1)[1] for was, _ in data["kept"]) == ["commit-msg", "pre-commit", "pre-push"]


# --- the tools people already use --------------------------------------------------------


def forbid_script(repo: Path) -> None:
    """A repository check that fails on files containing FORBIDDEN and records each run."""
    write(repo / "check.sh", '#!/bin/sh\necho ran >> "$(git rev-parse --show-toplevel)/../tool-ran"\n'
                             '! grep -l FORBIDDEN "$@"\n')
    git(repo, "add", "check.sh")
    git(repo, "commit", "-q", "-m", "check")


def installed_over_the_tool_and_restored(repo: Path) -> None:
    """ccm-guard installed over a tool's hooks: both work, and uninstall leaves them as they were."""
    hooks = repo / ".git/hooks"
    before = tree_state(hooks)
    install.install_repo(repo)
    wt = add_worktree(repo)
    tool_round_trip(repo, wt)
    install.uninstall_worktree(wt)
    install.uninstall_repo(repo)
    assert tree_state(hooks) == before


def tool_round_trip(repo: Path, wt: Path) -> None:
    """The tool works in the main checkout and, chained, in a guarded task worktree."""
    for where in (repo, wt):
        if where == wt:
            install_task(wt)
        assert commit(where, "bad.txt", "FORBIDDEN\n").returncode != 0
        git(where, "rm", "-q", "--cached", "bad.txt")
        (where / "bad.txt").unlink()
    assert commit(repo, "good.txt").returncode == 0
    proc = commit(wt, "fine.txt")
    assert proc.returncode == 0, proc.stderr
    assert (repo.parent / "tool-ran").read_text().count("ran") >= 4


def test_pre_commit_framework_keeps_working(repo: Path) -> None:
    pytest.importorskip("pre_commit", reason="pip install pre-commit to run this test")
    forbid_script(repo)
    write(repo / ".pre-commit-config.yaml", "repos:\n- repo: local\n  hooks:\n  - id: forbid\n"
          "    name: forbid\n    entry: ./check.sh\n    language: system\n", 0o644)
    git(repo, "add", ".pre-commit-config.yaml")
    git(repo, "commit", "-q", "-m", "pre-commit config")
    subprocess.run([sys.executable, "-m", "pre_commit", "install"], cwd=repo, check=True, capture_output=True)
    installed_over_the_tool_and_restored(repo)


@pytest.fixture(scope="session")
def node_tools(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """husky and lefthook from the npm registry, once per session (skipped if offline)."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: husky and lefthook cannot be tested for real")
    prefix = tmp_path_factory.mktemp("node-tools")
    proc = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--prefix", str(prefix),
                           "--cache", str(prefix / ".npm-cache"), "husky@9", "lefthook@2"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.skip(f"npm install husky lefthook failed: {proc.stderr.strip().splitlines()[-1:]}")
    return prefix / "node_modules"


def test_husky_keeps_working(repo: Path, node_tools: Path) -> None:
    forbid_script(repo)
    write(repo / ".husky/pre-commit", "./check.sh $(git diff --cached --name-only)\n", 0o644)
    git(repo, "add", ".husky")
    git(repo, "commit", "-q", "-m", "husky")
    husky = ["node", str(node_tools / "husky/bin.js")]
    subprocess.run(husky, cwd=repo, check=True, capture_output=True)
    assert git(repo, "config", "core.hooksPath") == ".husky/_"
    wt = add_worktree(repo)
    # husky's hooks dir is generated and git-ignored: a new worktree has none until husky
    # runs there (npm's prepare), as without ccm-guard. Its `git config core.hooksPath`
    # writes the shared config: run it before ccm-guard sets that key.
    subprocess.run(husky, cwd=wt, check=True, capture_output=True)
    husky_files, config = tree_state(repo / ".husky"), (repo / ".git/config").read_bytes()
    with pytest.raises(RepoError, match="--force"):
        install.install_repo(repo)
    install.install_repo(repo, force=True)
    tool_round_trip(repo, wt)
    install.uninstall_worktree(wt)
    install.uninstall_repo(repo)
    assert (repo / ".git/config").read_bytes() == config
    assert tree_state(repo / ".husky") == husky_files


def test_lefthook_keeps_working(repo: Path, node_tools: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    forbid_script(repo)
    write(repo / "lefthook.yml", "pre-commit:\n  commands:\n    forbid:\n      run: ./check.sh {staged_files}\n", 0o644)
    git(repo, "add", "lefthook.yml")
    git(repo, "commit", "-q", "-m", "lefthook config")
    monkeypatch.setenv("LEFTHOOK_BIN", str(node_tools / ".bin/lefthook"))
    subprocess.run([str(node_tools / ".bin/lefthook"), "install"], cwd=repo, check=True, capture_output=True)
    installed_over_the_tool_and_restored(repo)
