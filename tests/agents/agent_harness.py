"""Real agent CLIs (Claude Code, Codex, Gemini CLI, aider) driven offline by scripted model
endpoints on loopback (tests/agents/models.py).

The CLIs are not installed by the tests. `.ci/install-agents` installs the pinned versions
into a cache directory and prints it; point CCM_GUARD_TEST_AGENTS at it:

    export CCM_GUARD_TEST_AGENTS="$(.ci/install-agents | tail -n 1)"

Without it the tests look in the directory `.ci/install-agents --dir` names (the default
cache), and skip, saying what is missing, when the install is not complete there either.

This is not a conftest.py on purpose: tests/ has no __init__.py files, so every
conftest.py is imported as the module `conftest`, and a second one would replace the root
conftest that tests/adversarial import by that name. Test modules here import the
fixtures they use from this module (pytest finds fixtures in a test module's namespace):

    from agent_harness import agents, fresh_home, model  # noqa: F401  (fixtures)

Fixtures:
  agents           the installed CLIs (Agents: .bin(name), .dir)
  model            a started ModelServer; set `model.script` before running the agent
  fresh_home       $HOME as the root conftest made it: empty but for ~/.gitconfig (identity)
  lived_home       the same $HOME with the files a real user's home has for each agent

Helpers (plain functions): claude_run, codex_run, gemini_run, aider_run build an AgentRun
(argv, env additions, cwd-independent) for one agent pointed at the scripted endpoint;
run_agent runs one bare and returns the CompletedProcess.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

import pytest
from models import ModelServer

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / ".ci" / "install-agents"
AGENT_NAMES = ("claude", "codex", "gemini", "aider")
# Read now, before any fixture moves HOME: the install cache lives in the real HOME.
_REAL_HOME = os.environ.get("HOME", "")

# Model names as the agents send them (the server answers any name).
CLAUDE_MODEL = "claude-sonnet-4-6"
CODEX_MODEL = "scripted-model"
GEMINI_MODEL = "gemini-2.5-flash"
AIDER_MODEL = "openai/scripted-model"
API_KEY = "sk-scripted-test-key"


@dataclass(frozen=True)
class Agents:
    dir: Path

    def bin(self, name: str) -> Path:
        return self.dir / "bin" / name


def _install_dir() -> tuple[Path | None, str]:
    """The agents' directory and, when it is not usable, why."""
    how = f"install them with `{INSTALL.relative_to(ROOT)}` and set CCM_GUARD_TEST_AGENTS to the directory it prints"
    named = os.environ.get("CCM_GUARD_TEST_AGENTS")
    if named:
        where = Path(named)
    else:
        env = {**os.environ, "HOME": _REAL_HOME}
        try:
            out = subprocess.run([str(INSTALL), "--dir"], capture_output=True, text=True,
                                 env=env, timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"real agent CLIs not found (CCM_GUARD_TEST_AGENTS unset; {exc}): {how}"
        where = Path(out)
    if not (where / ".complete").is_file():
        return None, f"real agent CLIs not installed in {where} (no .complete marker): {how}"
    missing = [name for name in AGENT_NAMES if not os.access(where / "bin" / name, os.X_OK)]
    if missing:
        return None, f"agent CLIs missing in {where}/bin: {', '.join(missing)}: {how}"
    return where, ""


@pytest.fixture(scope="session")
def agents() -> Agents:
    where, why = _install_dir()
    if where is None:
        pytest.skip(why)
    return Agents(where)


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer() as server:
        yield server


@pytest.fixture
def fresh_home() -> Path:
    """$HOME as the root conftest's `isolated` made it: only ~/.gitconfig (an identity)."""
    return Path(os.environ["HOME"])


@pytest.fixture
def lived_home(fresh_home: Path) -> Path:
    """A HOME that has seen each agent before: settings, trust lists, credentials."""
    make_lived_home(fresh_home)
    return fresh_home


def make_lived_home(home: Path, trusted: Sequence[Path] = ()) -> None:
    """Write the files a user's HOME has after using each agent for a while. Hooks and
    notify commands only append a line to ~/hook-ran.log, so a test can see whether they
    ran and from where."""
    log = home / "hook-ran.log"
    trusted_paths = [str(p) for p in trusted] or ["/srv/some-other-project"]
    (home / ".gitconfig").write_text(
        "[user]\n\tname = Lived Person\n\temail = lived@example.com\n"
        "[alias]\n\tst = status --short\n[init]\n\tdefaultBranch = main\n"
        "[core]\n\texcludesFile = ~/.gitignore_global\n")
    (home / ".gitignore_global").write_text("*.swp\n.DS_Store\n")
    # Claude Code: ~/.claude.json (state, per-project trust) and ~/.claude/ (settings, creds).
    claude = home / ".claude"
    claude.mkdir(exist_ok=True)
    (home / ".claude.json").write_text(json.dumps({
        "numStartups": 12, "hasCompletedOnboarding": True, "firstStartTime": "2026-01-01T00:00:00Z",
        "userID": "0" * 64, "autoUpdates": False,
        "projects": {p: {"allowedTools": [], "hasTrustDialogAccepted": True,
                         "projectOnboardingSeenCount": 1, "mcpServers": {}} for p in trusted_paths},
        "mcpServers": {},
    }, indent=2))
    (claude / "settings.json").write_text(json.dumps({
        "permissions": {"allow": ["Bash(git status:*)"], "deny": []},
        "env": {"CLAUDE_LIVED_HOME": "1"},
        "hooks": {"SessionStart": [{"hooks": [
            {"type": "command", "command": f"echo claude-session-start \"$PWD\" >> {log}"}]}]},
    }, indent=2))
    (claude / ".credentials.json").write_text(json.dumps({"claudeAiOauth": None}))
    (claude / ".credentials.json").chmod(0o600)
    # Codex: ~/.codex/config.toml (+ per-project trust), auth.json.
    codex = home / ".codex"
    codex.mkdir(exist_ok=True)
    projects = "".join(f'\n[projects."{p}"]\ntrust_level = "trusted"\n' for p in trusted_paths)
    (codex / "config.toml").write_text(
        'model = "gpt-5-codex"\n'
        f'notify = ["sh", "-c", "echo codex-notify >> {log}"]\n' + projects)
    (codex / "auth.json").write_text(json.dumps({"OPENAI_API_KEY": None, "tokens": None}))
    (codex / "auth.json").chmod(0o600)
    # Gemini CLI: ~/.gemini/settings.json, trustedFolders.json.
    gemini = home / ".gemini"
    gemini.mkdir(exist_ok=True)
    (gemini / "settings.json").write_text(json.dumps({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "hooks": {"SessionStart": [{"hooks": [
            {"type": "command", "command": f"echo gemini-session-start >> {log}"}]}]},
    }, indent=2))
    (gemini / "trustedFolders.json").write_text(
        json.dumps({p: "TRUST_FOLDER" for p in trusted_paths}, indent=2))
    # aider: ~/.aider.conf.yml, ~/.aider/ (analytics id, installs, caches).
    (home / ".aider.conf.yml").write_text("dark-mode: true\n")
    aider = home / ".aider"
    aider.mkdir(exist_ok=True)
    (aider / "analytics.json").write_text(json.dumps(
        {"uuid": "00000000-0000-0000-0000-000000000000", "permanently_disable": True,
         "asked_opt_in": True}))


# -- command lines ---------------------------------------------------------------------------

@dataclass
class AgentRun:
    """One agent's command line and the environment it needs on top of the caller's."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def environ(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), **self.env}


def claude_run(agents: Agents, model: ModelServer, prompt: str, *,
               extra: Sequence[str] = ()) -> AgentRun:
    """`claude -p` with its Bash tool allowed without asking. (--dangerously-skip-permissions
    is refused when running as root unless IS_SANDBOX=1; --allowedTools works for anyone.)"""
    return AgentRun("claude", [
        str(agents.bin("claude")), "-p", prompt, "--model", CLAUDE_MODEL,
        "--allowedTools", "Bash", "--output-format", "text", *extra,
    ], {
        "ANTHROPIC_BASE_URL": model.base_url,
        "ANTHROPIC_API_KEY": API_KEY,
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    })


def codex_run(agents: Agents, model: ModelServer, prompt: str, *,
              sandbox: str = "danger-full-access", extra: Sequence[str] = ()) -> AgentRun:
    """`codex exec` against a model provider `scripted` at the loopback URL (Responses API).
    Its stdin must not be a pipe left open: give it /dev/null (run_agent does)."""
    provider = "model_providers.scripted"
    return AgentRun("codex", [
        str(agents.bin("codex")), "exec",
        "-c", "model_provider=scripted",
        "-c", f'{provider}.name="scripted"',
        "-c", f'{provider}.base_url="{model.base_url}/v1"',
        "-c", f'{provider}.wire_api="responses"',
        "-c", f'{provider}.env_key="SCRIPTED_MODEL_API_KEY"',
        "-c", f"{provider}.request_max_retries=0",
        "-c", f"{provider}.stream_max_retries=0",
        "-c", 'approval_policy="never"',
        "-m", CODEX_MODEL, "-s", sandbox, "--color", "never", *extra, prompt,
    ], {"SCRIPTED_MODEL_API_KEY": API_KEY})


def gemini_run(agents: Agents, model: ModelServer, prompt: str, *, home: Path,
               trusted: Sequence[Path] = (), extra: Sequence[str] = ()) -> AgentRun:
    """`gemini -p --yolo`. Gemini needs, in its home: the auth type chosen (with
    GOOGLE_GEMINI_BASE_URL set it would pick "gateway", which -p refuses), and the folder
    trusted (else --yolo falls back to asking, i.e. refusing). Both are written here.
    Its shell tool runs git with GIT_CONFIG_GLOBAL=/dev/null: ~/.gitconfig's identity is
    not seen, so the identity is passed as GIT_AUTHOR_*/GIT_COMMITTER_*."""
    gemini = home / ".gemini"
    gemini.mkdir(parents=True, exist_ok=True)
    settings_file = gemini / "settings.json"
    settings = json.loads(settings_file.read_text()) if settings_file.exists() else {}
    settings.setdefault("security", {}).setdefault("auth", {})["selectedType"] = "gemini-api-key"
    settings_file.write_text(json.dumps(settings, indent=2))
    folders_file = gemini / "trustedFolders.json"
    folders = json.loads(folders_file.read_text()) if folders_file.exists() else {}
    folders.update({str(p): "TRUST_FOLDER" for p in trusted})
    folders_file.write_text(json.dumps(folders, indent=2))
    return AgentRun("gemini", [
        str(agents.bin("gemini")), "-p", prompt, "--yolo", "-m", GEMINI_MODEL, *extra,
    ], {
        "GEMINI_API_KEY": API_KEY,
        "GOOGLE_GEMINI_BASE_URL": model.base_url,
        "GEMINI_CLI_NO_RELAUNCH": "true",
        "GIT_AUTHOR_NAME": "Gemini Agent", "GIT_AUTHOR_EMAIL": "gemini@example.com",
        "GIT_COMMITTER_NAME": "Gemini Agent", "GIT_COMMITTER_EMAIL": "gemini@example.com",
    })


def aider_run(agents: Agents, model: ModelServer, prompt: str, files: Sequence[str] = (), *,
              extra: Sequence[str] = ()) -> AgentRun:
    """`aider --message` with the openai-compatible endpoint, every question answered yes,
    nothing fetched from the network that can be avoided (the model-price list is still
    tried once: it fails fast offline)."""
    return AgentRun("aider", [
        str(agents.bin("aider")), "--model", AIDER_MODEL,
        "--openai-api-base", f"{model.base_url}/v1", "--openai-api-key", API_KEY,
        "--edit-format", "diff", "--yes-always", "--no-check-update", "--analytics-disable",
        "--no-show-release-notes", "--no-show-model-warnings", "--no-pretty",
        "--no-fancy-input", "--no-detect-urls", "--no-auto-lint", "--no-auto-test",
        "--no-suggest-shell-commands", *extra,
        "--message", prompt, *files,
    ], {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "AIDER_CHECK_UPDATE": "false",
    })


def run_agent(run: AgentRun, cwd: Path, *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the agent bare (no ccm-guard), stdin /dev/null, output captured."""
    return subprocess.run(run.argv, cwd=cwd, env=run.environ(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
