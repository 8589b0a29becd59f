"""Results as text for a person (and the verdict as JSON for programs): the verdict of a
run, and what an apply did."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Iterable

from ccm_guard.text import MAX_PATHS, safe

if TYPE_CHECKING:
    from ccm_guard.agent.runner import AgentResult
    from ccm_guard.detect.gates import GateResult
    from ccm_guard.detect.verdict import Verdict
    from ccm_guard.detect.verify import RangeReport
    from ccm_guard.run.fork import Comparison


def to_json(verdict: Verdict) -> str:
    # ASCII with escapes: a path that is not UTF-8 (git keeps any bytes) stays valid JSON.
    from ccm_guard.cli.options import json_text

    return json_text(verdict.to_json())


# What an agent's output can leave a terminal in: a string sequence (OSC, DCS, APC) that
# swallows everything up to its terminator, concealed or invisible colours, another
# character set, the alternate screen, a hidden cursor. ST and CAN end any sequence in
# progress; the rest puts the terminal back, so the verdict after it is seen as written.
TERMINAL_RESET = "\x1b\\\x18\x1b[0m\x1b(B\x1b[?1049l\x1b[?25h\r"


MAX_FINDINGS = 10  # per gate in the human verdict


def _on_terminal() -> bool:
    return sys.stdout is not None and sys.stdout.isatty()


def render(v: Verdict, *, places: bool = True) -> str:
    """The human verdict; on a terminal, preceded by TERMINAL_RESET. `places`: the
    worktree, logs and next steps (the demo leaves them out when it removes them all)."""
    text = _render(v, places)
    return TERMINAL_RESET + text if _on_terminal() else text


def _render(v: Verdict, places: bool) -> str:
    mark = {"pass": "PASS", "gates-failed": "FAIL"}.get(v.outcome, v.outcome.upper())
    lines = [f"ccm-guard: {mark}  task {safe(v.task)}  branch {safe(v.branch)}  base {v.base[:12]}"]
    lines.extend(f"  note: {safe(note)}" for note in v.notes)
    if v.setup is not None:
        lines.append(f"  setup: {safe(v.setup.describe())}{'' if v.setup.ok else '; the agent did not run'}"
                     f"   (logs in {v.setup.log_dir})")
        lines.extend(f"    | {safe(line)[:200]}" for line in v.setup.tail)
    if v.agent is not None:
        lines.append("  agent: " + _agent_line(v.agent) + f"  sandbox: {v.sandbox}  profile: {v.profile}")
    if v.identity:
        lines.append(f"  commits as: {safe(v.identity)}")
    if v.recovery:
        lines.append(f"  recovered: the sandbox blocked the agent's commit; ccm-guard committed "
                     f"{len(v.recovery.committed)} file(s) as {v.recovery.commit[:12]} "
                     "(Recovery-Reason trailer)")
        lines.append(f"    git said: {safe(v.recovery.line)}")
    if v.refusals:
        lines.append(f"  refused by the git shim and hooks: {len(v.refusals)}")
        for item in v.refusals[:5]:
            lines.append(f"    {safe(str(item.get('op', '?')))}: {safe(str(item.get('reason', item)))[:150]}")
    if v.check is not None:
        c = v.check
        put_back = [f"put back {len(c.discarded)} file(s) it wrote"] if c.discarded else []
        put_back += ["undid its commit or checkout"] if c.moved_branch else []
        lines.append(f"  check: {'passed' if c.ok else safe(c.describe())} after {c.duration:.1f}s"
                     + (f" ({'; '.join(put_back)})" if put_back else "") + f"   (logs in {c.log_dir})")
        lines.extend(f"    | {safe(line)[:200]}" for line in c.tail)
    if v.commits:
        lines.append(f"  commits: {len(v.commits)}")
        lines.extend(f"    {sha[:12]} {safe(subject)}" for sha, subject in v.commits[-10:])
    if v.files:
        added = sum(f.added or 0 for f in v.files)
        deleted = sum(f.deleted or 0 for f in v.files)
        lines.append(f"  files changed: {len(v.files)} (+{added} -{deleted})")
        for f in v.files[:MAX_PATHS]:
            counts = "binary" if f.added is None else f"+{f.added} -{f.deleted}"
            lines.append(f"    {counts:>12}  {safe(f.path)}")
        if len(v.files) > MAX_PATHS:
            lines.append(f"    ... and {len(v.files) - MAX_PATHS} more (--json lists all)")
    lines += _gate_lines(v.gates)
    for err in v.errors:
        lines.append(f"  error: {safe(err)}")
    if v.question is not None:
        lines.append(f"  blocked: the agent asks: {safe(v.question)[:500]}")
    if v.applied:
        lines.extend("  " + line for line in render_apply(v.applied))
    if v.apply_refused:
        lines.append(f"  apply refused: {safe(v.apply_refused)}")
    if not places:
        return "\n".join(lines)
    lines.append(f"  worktree: {v.worktree} ({v.disposition})")
    if v.archive:
        lines.append(f"  archive: {v.archive}")
    lines.append(f"  logs: {v.log_dir}")
    if v.next_steps:
        lines.append("  next:")
        lines.extend(f"    {step}" for step in v.next_steps)
    return "\n".join(lines)


def _gate_lines(gates: Iterable[GateResult]) -> list[str]:
    lines = ["  gates:"]
    for g in gates:
        lines.append(f"    {g.status.upper():7} {g.name}" + (f": {safe(g.note)}" if g.note else ""))
        # Failures first, and a bounded number: an agent that plants thousands of files
        # must not bury the verdict (--json lists every finding).
        findings = sorted(g.findings, key=lambda f: f.severity != "fail")
        for finding in findings[:MAX_FINDINGS]:
            lines.append(f"      {'x' if finding.severity == 'fail' else '!'} {safe(finding.reason)}")
            shown = finding.paths[:MAX_PATHS]
            lines.extend(f"          {safe(p)}" for p in shown)
            if len(finding.paths) > len(shown):
                lines.append(f"          ... and {len(finding.paths) - len(shown)} more")
        if len(findings) > MAX_FINDINGS:
            lines.append(f"      ... and {len(findings) - MAX_FINDINGS} more findings (--json lists all)")
    return lines


def render_range(r: RangeReport) -> str:
    """`verify`'s report for a person."""
    lines = [f"ccm-guard verify: {r.outcome.upper()}  {r.base[:12]}..{r.head[:12]}  role {safe(r.role)}  "
             f"policy: {', '.join(r.policy_files) or 'built-in'} (as committed at the base)",
             f"  commits: {len(r.commits)}"]
    lines.extend(f"    {sha[:12]} {safe(subject)}" for sha, subject in r.commits[-10:])
    return "\n".join(lines + _gate_lines(r.gates))


def github_annotations(r: RangeReport) -> str:
    """Workflow commands GitHub shows on the pull request: one per finding and path (a
    finding without paths is shown on the run)."""
    lines: list[str] = []
    for g in r.gates:
        for f in g.findings:
            level = "error" if f.severity == "fail" else "warning"
            message = _escape(f"{g.name}: {f.reason}")
            # Paths of the tree are files on the pull request; a commit's finding names a commit.
            targets = (f.paths[:MAX_PATHS] if g.name in ("path-policy", "limits") else ()) or ("",)
            lines.extend(f"::{level} file={_escape(p, prop=True)},title=ccm-guard {g.name}::{message}" if p
                         else f"::{level} title=ccm-guard {g.name}::{message}" for p in targets)
    lines.append(f"ccm-guard verify: {r.outcome} ({r.base[:12]}..{r.head[:12]}, role {r.role}, "
                 f"{len(r.commits)} commit(s))")
    return "\n".join(lines)


def _escape(text: str, prop: bool = False) -> str:
    """GitHub's escaping of workflow command data (and, in properties, ':' and ',')."""
    text = safe(text).replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def _agent_line(a: AgentResult) -> str:
    if a.timed_out:
        how = "timed out and was stopped"
    elif a.interrupted:
        how = "interrupted"
    elif a.signal:
        how = f"killed by signal {a.signal}"
    else:
        how = f"exited {a.exit_code}"
    return f"{how} after {a.duration:.1f}s ({'terminal' if a.terminal else 'pipes'})"


def render_apply(a: dict[str, Any]) -> list[str]:
    """The apply summary: what landed where (`task apply` and `exec --apply`)."""
    lines = [f"applied: task {safe(a['task'])} into {safe(a['target'])} ({a['strategy']}) as {a['new'][:12]}"
             f"  files changed: {a['files']} (+{a['insertions']} -{a['deletions']})"]
    if a.get("attempts", 1) > 1:
        lines.append(f"  the target moved during the apply; it landed on attempt {a['attempts']}")
    if a.get("checkout"):
        lines.append(f"  updated your checkout: {safe(a['checkout'])}")
    return lines


def render_comparison(c: "Comparison", errors: dict[str, str] | None = None) -> str:
    """A fork group side by side (`exec --fork`, `task compare`)."""
    lines = [f"ccm-guard: {len(c.forks)} forks of {safe(c.group)} from base {c.base[:12]}",
             f"  {'FORK':30} {'VERDICT':14} {'FILES':>5} {'+/-':>12} {'COMMITS':>7}  {'AGENT':14} CHECK"]
    for f in c.forks:
        verdict = (f.outcome or f"({f.status.lower()})") + (" *" if f.pickable else "")
        agent = f"{f.agent_seconds:.1f}s exit {f.agent_exit}" if f.agent_seconds is not None else "-"
        check = "-" if f.check is None else (
            f"{'pass' if f.check['ok'] else 'timed out' if f.check['timed_out'] else 'fail'} "
            f"{f.check['duration']:.1f}s" + (f" (put back {len(f.check['discarded'])} file(s))"
                                           if f.check["discarded"] else ""))
        lines.append(f"  {safe(f.task):30} {verdict:14} {len(f.files):>5} {f'+{f.added} -{f.deleted}':>12} "
                     f"{f.commits:>7}  {agent:14} {check}")
        if f.failed_gates:
            lines.append(f"  {'':30} failed: {', '.join(f.failed_gates)}")
        if errors and f.task in errors:
            lines.append(f"  {'':30} error: {safe(errors[f.task])}")
    overlaps = c.overlaps
    if overlaps:
        lines.append("  changed by more than one fork:")
        lines.extend(f"    {safe(path)}: {', '.join(tasks)}" for path, tasks in list(overlaps.items())[:MAX_PATHS])
        if len(overlaps) > MAX_PATHS:
            lines.append(f"    ... and {len(overlaps) - MAX_PATHS} more (--json lists all)")
    best = c.best
    lines.append("  (* passed its gates" + (" and its check" if any(f.check for f in c.forks) else "") + ")")
    lines.append("  next:")
    if best:
        lines.append(f"    pick:    ccm-guard task pick {best.task}   (applies it; archives the others)")
    passed = [f.task for f in c.forks if f.pickable]
    if len(passed) > 1:
        lines.append(f"    compare: ccm-guard task diff {passed[0]} {passed[1]}")
    lines.append(f"    again:   ccm-guard task compare {c.group}")
    if not best:
        lines.append(f"    inspect: ccm-guard task show {c.forks[0].task}   (no fork passed)")
    return "\n".join(lines)
