"""Command line, repository side: policy, check-paths, install/uninstall, hook, roots.

Parse, call one function, render; nothing else (see cli/__init__.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ccm_guard.cli.options import CONTEXT, complete_roles, handled, json_text
from ccm_guard.errors import EXIT_CODE_TABLE


@click.group(context_settings=CONTEXT)
def policy() -> None:
    """Roles and their path rules: show the effective policy, or check a file.

    \b
    Layers, later ones winning key by key: the built-in roles (implementor, test-writer,
    reviewer, qa); $CCM_GUARD_HOME/policy.toml; the repository's .ccm-guard.toml (or
    [tool.ccm-guard] in pyproject.toml) as committed; --policy FILE. exec reads the
    repository's file from the task's base commit, never from the agent's worktree.

    \b
    Example .ccm-guard.toml:
      default_role = "implementor"
      [roles.docs-writer]
      extends = "implementor"
      allow = ["docs/", "*.md"]
      [roles.docs-writer.limits]
      max_files = 20
    """


@policy.command("show", context_settings=CONTEXT)
@click.option("--role", metavar="ROLE", shell_complete=complete_roles, help="Only this role (default: all).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path), help="An extra policy file.")
@click.option("--json", "as_json", is_flag=True)
@handled
def policy_show(role: str | None, policy_file: Path | None, as_json: bool) -> None:
    """Print the effective policy of this repository and where each value came from."""
    from ccm_guard import policy as pol
    from ccm_guard.detect.policy_at import for_checkout

    _, effective = for_checkout(Path.cwd(), "HEAD", policy_file)
    names = [effective.role(role).name] if role else sorted(effective.roles)
    data = {"default_role": effective.default_role, "files": effective.files,
            "roles": {n: pol.describe(effective.roles[n]) for n in names}}
    if as_json:
        click.echo(json_text(data))
        return
    click.echo(f"default role: {effective.default_role}   files: {', '.join(effective.files) or '(built-in only)'}")
    for name, values in data["roles"].items():  # type: ignore[attr-defined]
        click.echo(f"[roles.{name}]")
        for key, item in values.items():
            click.echo(f"  {key} = {json.dumps(item['value'])}    # {item['from']}")


@policy.command("check", context_settings=CONTEXT)
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@handled
def policy_check(file: Path | None) -> None:
    """Validate a policy file (default: .ccm-guard.toml in the current directory)."""
    from ccm_guard import policy as pol

    path = file or Path(pol.POLICY_FILE)
    effective = pol.build([pol.read_file(path)])
    click.echo(f"{path}: ok ({len(effective.roles)} roles, default {effective.default_role})")


@click.command("check-paths", context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.argument("rev_range", required=False, metavar="[REV-RANGE]")
@click.option("--staged", is_flag=True, help="Check what is staged for the next commit (the default).")
@click.option("--role", metavar="ROLE", shell_complete=complete_roles,
              help="The role whose rules apply (default: a range, the policy's default role; the staged "
                   "change, your own commit, only what breaks any checkout).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path), help="An extra policy file.")
@click.option("--json", "as_json", is_flag=True)
@handled
def check_paths(rev_range: str | None, staged: bool, role: str | None, policy_file: Path | None,
                as_json: bool) -> None:
    """Check paths against a role's rules, outside exec: what is staged, or each commit of a range.

    \b
      ccm-guard check-paths --role test-writer            # the staged change
      ccm-guard check-paths --role test-writer main..HEAD # every commit of a branch
      ccm-guard check-paths                               # your own commit: twins, links
    The policy is read as committed at HEAD for the staged change, at BASE for a range
    (`verify` judges a range in full). Exit 1 when a path breaks a rule.
    """
    from ccm_guard.detect.checkpaths import check_paths_command

    violations = check_paths_command(Path.cwd(), rev_range if not staged else None, role, policy_file)
    if as_json:
        click.echo(json_text([v._asdict() for v in violations], key="violations"))
    else:
        for v in violations:
            click.echo(("warning: " if v.severity == "warn" else "") + v.line())
    sys.exit(1 if any(v.severity == "fail" for v in violations) else 0)


@click.command(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.argument("rev_range", required=False, metavar="[BASE..HEAD]")
@click.option("--role", metavar="ROLE", shell_complete=complete_roles, help="The role the agent ran as (default: the policy's default role).")
@click.option("--policy", "policy_file", type=click.Path(dir_okay=False, path_type=Path), help="An extra policy file.")
@click.option("--json", "as_json", is_flag=True, help="The report as JSON (docs/json.md).")
@click.option("--format", "fmt", type=click.Choice(["text", "github"]), default="text", show_default=True,
              help="github: workflow-command annotations on the pull request, and the report in "
                   "$GITHUB_STEP_SUMMARY and `outcome` in $GITHUB_OUTPUT when those are set.")
@handled
def verify(rev_range: str | None, role: str | None, policy_file: Path | None, as_json: bool, fmt: str) -> None:
    """Judge a range of commits (an agent's pull request) the way exec judges a run.

    \b
    What a range can show: the role's path rules on every commit (and every parent of a
    merge), executable project content and control paths, an edit of the policy, the
    role's limits, and commits that claim to be ccm-guard's. The policy is the one
    committed at BASE, so a pull request cannot loosen its own rules.
      ccm-guard verify main..HEAD --role test-writer
      ccm-guard verify --format github        # in GitHub Actions: the pull request's range
    Without BASE..HEAD, GitHub's event payload ($GITHUB_EVENT_PATH) names the pull
    request's base and head. Exit 1 when a gate fails.
    """
    from ccm_guard.cli.render import github_annotations, render_range
    from ccm_guard.detect.verify import github_range, verify_range

    report = verify_range(Path.cwd(), rev_range or github_range(), role, policy_file)
    if as_json:
        click.echo(json_text(report.to_json()))
    elif fmt == "github":
        click.echo(github_annotations(report))
        _github_files(report.outcome, render_range(report))
    else:
        click.echo(render_range(report))
    sys.exit(1 if report.outcome == "fail" else 0)


def _github_files(outcome: str, text: str) -> None:
    """The step summary (Markdown) and the step's `outcome` output, where the runner asks."""
    import os

    for var, content in (("GITHUB_STEP_SUMMARY", f"### ccm-guard verify: {outcome}\n\n```\n{text}\n```\n"),
                         ("GITHUB_OUTPUT", f"outcome={outcome}\n")):
        if os.environ.get(var):
            with open(os.environ[var], "a", encoding="utf-8") as out:
                out.write(content)


@click.command(context_settings=CONTEXT)
@click.argument("path", required=False, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help='JSON: {"schema": 1, "roots": [...]}.')
@click.option("--format", "fmt", type=click.Choice(["lines", "codex"]), default="lines", show_default=True,
              help="codex: the repeatable --add-dir DIR arguments.")
@handled
def roots(path: Path | None, as_json: bool, fmt: str) -> None:
    """The directories a sandboxed agent in a linked worktree needs writable to commit.

    \b
    One per line: the worktree, its admin dir, the shared objects/ and the task branch's
    ref and reflog directories; not config or hooks/. Nothing for a main checkout or a
    directory outside git. All or nothing: if any probe fails, an error says why.
      codex exec -s workspace-write $(ccm-guard roots --format codex) "..."
    """
    from ccm_guard.prevent.roots import writable_roots

    found = writable_roots((path or Path.cwd()).resolve())
    if as_json:
        click.echo(json_text([str(p) for p in found], key="roots"))
    elif fmt == "codex":
        click.echo(" ".join(f"--add-dir {p}" for p in found[1:]))
    else:
        for p in found:
            click.echo(str(p))


def _show(report: "object", as_json: bool) -> None:
    data = report.to_json()  # type: ignore[attr-defined]
    if as_json:
        click.echo(json_text(data))
        return
    click.echo(f"{data['target']}: hooks in {data['hooks_dir']}")
    for key in ("written", "chained", "restored", "removed", "config", "notes"):
        for item in data[key]:
            click.echo(f"  {key}: {item}")
    for was, now in data["kept"]:
        click.echo(f"  kept: {was} -> {now} (chained)")


@click.command(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.argument("repo", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--worktree", "linked", type=click.Path(file_okay=False, path_type=Path),
              help="Guard one linked worktree only (per-worktree config): its branch is the only ref it may move.")
@click.option("--role", metavar="ROLE", shell_complete=complete_roles, help="With --worktree: the role whose path rules pre-commit applies.")
@click.option("--force", is_flag=True, help="Install even though core.hooksPath is set (the old hooks are chained).")
@click.option("--json", "as_json", is_flag=True)
@handled
def install(repo: Path | None, linked: Path | None, role: str | None, force: bool, as_json: bool) -> None:
    """Install the guard hooks into a repository (existing hooks are kept and chained).

    \b
      ccm-guard install                      # the whole repository
      ccm-guard install --worktree ../wt     # one linked worktree, on its own branch
    In a whole repository the hooks act only in worktrees ccm-guard set up; in your own
    checkout they step aside. `ccm-guard uninstall` restores exactly what was there.
    """
    from ccm_guard.prevent.hooks import install_repo, install_worktree_here

    if linked is not None:
        _show(install_worktree_here(linked.resolve(), role), as_json)
    else:
        _show(install_repo((repo or Path.cwd()).resolve(), force=force), as_json)


@click.command(context_settings=CONTEXT, epilog=EXIT_CODE_TABLE)
@click.argument("repo", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--worktree", "linked", type=click.Path(file_okay=False, path_type=Path),
              help="Remove them from this linked worktree only.")
@click.option("--json", "as_json", is_flag=True)
@handled
def uninstall(repo: Path | None, linked: Path | None, as_json: bool) -> None:
    """Remove the guard hooks and restore the repository's own, byte for byte."""
    from ccm_guard.prevent.hooks import uninstall_repo, uninstall_worktree

    if linked is not None:
        _show(uninstall_worktree(linked.resolve()), as_json)
    else:
        _show(uninstall_repo((repo or Path.cwd()).resolve()), as_json)


@click.command(context_settings={**CONTEXT, "ignore_unknown_options": True}, hidden=True)
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def hook(name: str, args: tuple[str, ...]) -> None:
    """Run one guard hook (what the installed hook scripts call)."""
    from ccm_guard.prevent.hookrun import main as run_hook

    sys.exit(run_hook(name, list(args), sys.stdin.buffer))
