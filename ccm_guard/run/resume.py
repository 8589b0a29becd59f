"""`task resume`: run an agent again in a BLOCKED task's worktree
(docs/design-notes.md#blocked-tasks-ask-a-question).

The metadata baseline is taken afresh: the blocked run's gates already showed the metadata
matched the original baseline, and between the runs only the person and ccm-guard acted,
so what the person did meanwhile (an apply elsewhere, a commit of theirs) is not the
agent's. The work itself is still judged against the task's base.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from ccm_guard.agent import runner
from ccm_guard.agent.options import ExecOptions
from ccm_guard.detect.policy_at import policy_at
from ccm_guard.detect.snapshot import main_files, take
from ccm_guard.detect.verdict import Checks, Verdict
from ccm_guard.errors import StateError
from ccm_guard.git import Repo, layout
from ccm_guard.prevent import arm as prevention
from ccm_guard.run.exec import (
    QUESTION_FILE,
    Ready,
    file_digest,
    run_and_judge,
    write_baseline,
)
from ccm_guard.state.registry import Registry, Task
from ccm_guard.worktree import ops as taskops


def resume_task(registry: Registry, task_id: str, opts: ExecOptions) -> Verdict:
    task = registry.get(task_id)
    if task.status != "BLOCKED":
        raise StateError(f"task {task.id} is {task.status}, not BLOCKED: only a task whose agent asked a question "
                         "can be resumed (run a new task with `ccm-guard exec --base " + task.branch + "`)")
    taskops.task_repo(task)  # the worktree is there and safe to run git in
    pins = taskops.pins_of(task)
    command = runner.resolve_command(opts.command, os.environ, Path.cwd())
    recorded = task.option_dict()
    override = Path(recorded["policy"]) if recorded.get("policy") else None
    role = policy_at(layout.host_repo(pins.common_dir), task.base, override).role(recorded.get("role"))
    checks = Checks.of(role, bool(recorded.get("read_only")), recorded.get("require_commit"), recorded.get("policy"))
    prevention.check_options(opts.sandbox, opts.no_network, opts.agent)
    _file_question(pins.worktree, Path(task.log_dir))
    armed = prevention.arm(task, pins, role, command, sandbox_mode=opts.sandbox, no_network=opts.no_network,
                           agent=opts.agent, allow_ports=opts.allow_ports)
    before = take(pins)
    main_before = main_files(Repo(Path(task.main_git_dir), pins.common_dir, Path(task.main_worktree)))
    setup_files = _setup_files(task)  # what the first run's setup left is still not the agent's
    baseline = write_baseline(Path(task.log_dir, f"baseline-resume-{int(time.time())}.json"), before, main_before,
                              setup_files)
    registry.move(task.id, "ACTIVE", baseline=str(baseline), pid=os.getpid(), command=json.dumps(opts.command))
    registry.set_option(task.id, "baseline_sha256", file_digest(baseline))
    task = registry.get(task.id)
    return run_and_judge(opts, registry, Ready(task=task, pins=pins, role=role, checks=checks, armed=armed,
                                               before=before, main_before=main_before, setup_files=setup_files))


def _setup_files(task: Task) -> dict[str, str]:
    """The setup step's files from the task's previous baseline, if its digest still holds."""
    path = Path(task.baseline) if task.baseline else None
    if path is None or not path.exists() or file_digest(path) != task.option("baseline_sha256"):
        return {}
    files = json.loads(path.read_text()).get("setup_files")
    return files if isinstance(files, dict) else {}


def _file_question(worktree_dir: Path, log_dir: Path) -> None:
    """Move the answered question out of the worktree, so it does not block the next run."""
    question = worktree_dir / QUESTION_FILE
    if os.path.lexists(question):
        answered = log_dir / "questions"
        answered.mkdir(parents=True, exist_ok=True)
        os.replace(question, answered / f"{int(time.time() * 1000)}.json")
