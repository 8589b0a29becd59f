"""What the agent changed in its task-private home (agent.homes), judged.

Nothing there is written back to the person's home, so a change harms nobody by itself;
but a hook, an MCP server, a permission rule or a command the agent's CLI would run is
what an attacker plants, and a resumed task would run it. Those fail; any other change of
a settings or instructions file is a note.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from ccm_guard.detect.context import FAIL, WARN, Finding
from ccm_guard.detect.gates import GateResult

GATE = "agent-home"

# Keys of a settings file that make the agent's CLI run something or widen what it may do.
_SENSITIVE = {
    # Claude Code: settings.json, settings.local.json, .claude.json (and its per-project entries)
    "hooks", "permissions", "allowedTools", "mcpServers", "enabledMcpjsonServers", "enableAllProjectMcpServers",
    "apiKeyHelper", "awsAuthRefresh", "awsCredentialExport", "otelHeadersHelper", "statusLine", "env",
    "disableAllHooks", "forceLoginMethod", "plugins", "enabledPlugins", "extraKnownMarketplaces",
    # Codex: config.toml
    "mcp_servers", "notify", "model_providers", "model_provider", "profiles", "profile",
    "shell_environment_policy", "sandbox_mode", "sandbox_workspace_write", "approval_policy",
    # Gemini CLI: settings.json
    "tools", "mcp", "security", "hooksConfig", "extensions", "advanced",
}
# Variables a CLI puts into its own settings' `env` (Claude moves a legacy `autoUpdates`
# there on start): they switch things off and steer nothing.
_QUIET_ENV = frozenset({"DISABLE_AUTOUPDATER", "DISABLE_TELEMETRY", "DISABLE_ERROR_REPORTING",
                        "DISABLE_BUG_COMMAND", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"})
# Directories whose files are commands, rules or code the CLI loads.
_SENSITIVE_DIRS = ("hooks/", "rules/", "plugins/", "extensions/", "policies/")


def gate(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> GateResult:
    try:
        return GateResult.of(GATE, findings(before, after))
    except Exception as exc:  # the agent wrote these files: whatever breaks the judging fails it
        return GateResult.of(GATE, [Finding(GATE, f"could not judge the agent's home ({type(exc).__name__}): "
                                            "treated as tampered")])


def findings(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> list[Finding]:
    found: list[Finding] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        keys = _changed_keys(name, old, new)
        if name.startswith(_SENSITIVE_DIRS) or f"{name}/" in _SENSITIVE_DIRS:
            found.append(Finding(GATE, f"the agent {_verb(old, new)} {name} in its home: code its CLI loads", (name,)))
        elif name.rsplit("/", 1)[-1] == ".env":
            found.append(Finding(GATE, f"the agent {_verb(old, new)} {name} in its home: variables its CLI loads "
                                 "on start (a base URL, a key)", (name,)))
        elif keys is None:
            found.append(Finding(GATE, f"the agent {_verb(old, new)} {name} in its home", (name,), WARN))
        elif keys & _SENSITIVE:
            found.append(Finding(GATE, f"the agent changed {', '.join(sorted(keys & _SENSITIVE))} in {name} of its "
                                 "home: hooks, MCP servers, permissions or commands its CLI would run", (name,), FAIL))
        elif keys and not name.endswith(".claude.json"):
            # .claude.json is rewritten on every start (counters, tips): only its sensitive keys count.
            found.append(Finding(GATE, f"the agent changed {', '.join(sorted(keys))} in {name} of its home",
                                 (name,), WARN))
    return found


def _verb(old: bytes | None, new: bytes | None) -> str:
    return "added" if old is None else "removed" if new is None else "changed"


def _changed_keys(name: str, old: bytes | None, new: bytes | None) -> set[str] | None:
    """The top-level keys (and per-project keys) that differ; None when not a settings file."""
    parse = _parser(name)
    if parse is None:
        return None
    try:
        a, b = parse(old), parse(new)
    except (ValueError, RecursionError):
        return {"(unparsable)"} | _SENSITIVE  # a file the CLI cannot read either: treat as the worst
    keys = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    env_a, env_b = a.get("env", {}), b.get("env", {})
    if "env" in keys and isinstance(env_a, dict) and isinstance(env_b, dict):
        names = {k for k in set(env_a) | set(env_b) if env_a.get(k) != env_b.get(k)}
        if names <= _QUIET_ENV:
            keys = (keys - {"env"}) | {f"env.{name}" for name in names}
    projects_a, projects_b = a.get("projects"), b.get("projects")
    if "projects" in keys and isinstance(projects_a, dict) and isinstance(projects_b, dict):
        keys.discard("projects")
        for project in set(projects_a) | set(projects_b):
            pa, pb = projects_a.get(project), projects_b.get(project)
            if isinstance(pa, dict) and isinstance(pb, dict):
                keys |= {k for k in set(pa) | set(pb) if pa.get(k) != pb.get(k)}
            elif pa != pb:  # an entry added, removed, or not a table any more
                keys |= {k for entry in (pa, pb) if isinstance(entry, dict) for k in entry} or {"projects"}
    return keys


def _parser(name: str) -> Any:
    if name.endswith(".json"):
        return lambda data: _as_dict(json.loads(data) if data else {})
    if name.endswith(".toml"):
        import tomllib  # here: only a home with .toml files to watch (codex's) parses TOML

        return lambda data: _as_dict(tomllib.loads(data.decode()) if data else {})
    return None


def _as_dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError("not a table")
    return value
