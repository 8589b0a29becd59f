"""Which agent a command is: found from the program that really runs, however it is launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from ccm_guard.agent.profiles import (
    codex_workspace_write,
    launch_of,
    model_ports,
    with_add_dirs,
    without_own_sandbox,
)


def _program(tmp_path: Path, relative: str) -> Path:
    path = tmp_path / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_an_npm_bin_link_is_followed_to_the_package(tmp_path: Path) -> None:
    real = _program(tmp_path, "lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe")
    link = tmp_path / "bin" / "my-assistant"
    link.parent.mkdir()
    link.symlink_to(real)
    assert launch_of([str(link), "-p", "hi"]).profile == "claude"


@pytest.mark.parametrize("relative, profile", [
    ("x/claude.exe", "claude"),
    ("x/@openai/codex/bin/codex.js", "codex"),
    ("x/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/codex/codex", "codex"),
    ("x/codex-x86_64-unknown-linux-musl", "codex"),
    ("x/@google/gemini-cli/bundle/gemini.js", "gemini"),
    ("venv/bin/aider", "aider"),
    ("x/my-agent.sh", "generic"),
])
def test_an_absolute_path_is_recognised_by_its_real_name(tmp_path: Path, relative: str, profile: str) -> None:
    assert launch_of([str(_program(tmp_path, relative))]).profile == profile


def test_an_interpreter_running_the_agents_script(tmp_path: Path) -> None:
    script = _program(tmp_path, "lib/node_modules/@anthropic-ai/claude-code/cli.js")
    launch = launch_of(["/usr/bin/node", "--max-old-space-size", "4096", str(script), "-p", "x"])
    assert (launch.profile, launch.head) == ("claude", 4)
    assert launch_of(["python3", "-m", "aider", "--yes-always"]).profile == "aider"
    assert launch_of(["python3", "-m", "aider", "--yes-always"]).head == 3
    assert launch_of(["python3", "-m", "http.server"]).profile == "generic"
    assert launch_of(["node", str(_program(tmp_path, "other/app.js"))]).profile == "generic"


def test_a_forced_profile_keeps_the_launchers_length(tmp_path: Path) -> None:
    script = _program(tmp_path, "x/@openai/codex/bin/codex.js")
    assert launch_of(["node", str(script), "exec"], "generic").profile == "generic"
    assert launch_of(["node", str(script), "exec"], "generic").head == 2


def test_add_dirs_go_after_the_launcher_and_exec() -> None:
    roots = [Path("/wt"), Path("/r/.git/worktrees/t"), Path("/r/.git/objects")]
    assert with_add_dirs(["node", "codex.js", "exec", "-s", "workspace-write", "go"], 2, roots) == [
        "node", "codex.js", "exec", "--add-dir", "/r/.git/worktrees/t", "--add-dir", "/r/.git/objects",
        "-s", "workspace-write", "go"]
    assert with_add_dirs(["codex", "go"], 1, roots[:2]) == ["codex", "--add-dir", "/r/.git/worktrees/t", "go"]


@pytest.mark.parametrize("args, expected", [
    (["-s", "workspace-write", "exec", "x"], True),
    (["exec", "--sandbox=workspace-write", "x"], True),
    (["exec", "-c", 'sandbox_mode="workspace-write"', "x"], True),
    (["exec", "--config", "sandbox_mode=workspace-write", "x"], True),
    (["exec", "-s", "read-only", "x"], False),
    (["exec", "x"], False),
    (["exec", "--", "-s", "workspace-write"], False),  # after --: the prompt, not an option
])
def test_codex_workspace_write_from_its_arguments(args: list[str], expected: bool) -> None:
    assert codex_workspace_write(args, None) is expected


def test_codex_workspace_write_from_its_config_and_profiles(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(
        'sandbox_mode = "workspace-write"\n[profiles.ro]\nsandbox_mode = "read-only"\n'
        '[profiles.ww]\nsandbox_mode = "workspace-write"\n')
    assert codex_workspace_write(["exec", "x"], tmp_path)
    assert not codex_workspace_write(["exec", "-p", "ro", "x"], tmp_path)
    assert not codex_workspace_write(["exec", "-s", "read-only", "x"], tmp_path)  # the command line wins
    (tmp_path / "config.toml").write_text('profile = "ww"\n[profiles.ww]\nsandbox_mode = "workspace-write"\n')
    assert codex_workspace_write(["exec", "x"], tmp_path)


def test_model_ports_come_from_the_agents_base_url() -> None:
    env = {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8123/v1", "OPENAI_BASE_URL": "https://proxy:9443"}
    assert model_ports("claude", env) == (443, 8123)
    assert model_ports("codex", env) == (443, 9443)
    assert model_ports("generic", env) == ()
    assert model_ports("claude", {"ANTHROPIC_BASE_URL": "http://[bad"}) == (443,)


def test_inside_ccm_guards_sandbox_codex_runs_its_commands_unsandboxed_itself() -> None:
    assert without_own_sandbox(["codex", "exec", "-s", "workspace-write", "--", "-s x"], 1) == [
        "codex", "exec", "-c", 'sandbox_mode="danger-full-access"', "-s", "danger-full-access", "--", "-s x"]
    assert without_own_sandbox(["node", "codex.js", "--sandbox=workspace-write", "go"], 2) == [
        "node", "codex.js", "-c", 'sandbox_mode="danger-full-access"', "--sandbox=danger-full-access", "go"]
    assert without_own_sandbox(["codex", "exec", "-c", "sandbox_mode=workspace-write", "go"], 1)[-3:] == [
        "-c", 'sandbox_mode="danger-full-access"', "go"]


def test_codex_model_ports_from_its_options_and_config(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text('[model_providers.local]\nbase_url = "http://127.0.0.1:7001/v1"\n')
    args = ["exec", "-c", 'model_providers.x.base_url="http://127.0.0.1:7002/v1"']
    assert model_ports("codex", {}, args, tmp_path) == (443, 7001, 7002)


@pytest.mark.parametrize("args", [
    ["exec", "--config=sandbox_mode=workspace-write", "go"],
    ["exec", "-sworkspace-write", "go"],
    ["exec", "-c", "sandbox_mode = 'workspace-write'", "go"],
])
def test_every_form_of_choosing_codexs_sandbox_is_seen_and_rewritten(args: list[str]) -> None:
    assert codex_workspace_write(args, None)
    rewritten = without_own_sandbox(["codex", *args], 1)
    assert not codex_workspace_write(rewritten[1:], None)


def test_a_codex_profile_file_chooses_its_sandbox(tmp_path: Path) -> None:
    (tmp_path / "ws.config.toml").write_text('sandbox_mode = "workspace-write"\n')
    assert codex_workspace_write(["exec", "-p", "ws", "go"], tmp_path)
    assert not codex_workspace_write(["exec", "-p", "other", "go"], tmp_path)


def test_a_prompt_that_mentions_a_base_url_opens_no_port() -> None:
    assert model_ports("codex", {}, ["exec", "set base_url=http://h:22 please"]) == (443,)
