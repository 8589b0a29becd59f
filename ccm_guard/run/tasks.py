"""A task's sandbox is made by one of two strategies, chosen once and then used through
one interface: a linked worktree of the repository (the default), or a copied directory
for a folder that is in no git repository. Nothing downstream asks which one it has.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from ccm_guard.errors import UsageError
from ccm_guard.state.registry import COPIED_DIRECTORY, LINKED_WORKTREE, Registry, Task

if TYPE_CHECKING:  # apply, discard and restore need none of exec's machinery (30 ms of imports)
    from ccm_guard.agent.options import ExecOptions
    from ccm_guard.detect.verdict import Verdict


class Applied(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class Strategy(Protocol):
    @property
    def name(self) -> str:
        """The strategy's name as the task's options record it."""

    def execute(self, opts: ExecOptions, registry: Registry) -> Verdict:
        """Make the sandbox, run the agent in it, judge and dispose of the result."""

    def apply(self, registry: Registry, task: Task, *, into: str | None, how: str, retries: int) -> Applied:
        """Bring the task's work into its target; nothing changes when that is refused."""

    def discard(self, registry: Registry, task: Task) -> dict[str, Any]:
        """Archive all of the task's work (committed and not), then remove its sandbox."""

    def restore(self, registry: Registry, task: Task) -> dict[str, Any]:
        """Bring a discarded task back from its archive."""


class LinkedWorktree(NamedTuple):
    name: str = LINKED_WORKTREE

    def execute(self, opts: ExecOptions, registry: Registry) -> Verdict:
        from ccm_guard.run import exec as runexec

        return runexec.exec_task(opts, registry)

    # apply and ops are imported when a task needs them: not on exec's path.
    def apply(self, registry: Registry, task: Task, *, into: str | None, how: str, retries: int) -> Applied:
        from ccm_guard.worktree import apply as applying

        return applying.apply_task(registry, task.id, into, how, retries)

    def discard(self, registry: Registry, task: Task) -> dict[str, Any]:
        from ccm_guard.worktree import ops

        return ops.discard(registry, task.id)

    def restore(self, registry: Registry, task: Task) -> dict[str, Any]:
        from ccm_guard.worktree import ops

        return ops.restore(registry, task.id)


class CopiedDirectory(NamedTuple):
    name: str = COPIED_DIRECTORY

    # The copy modules are imported when a task needs them: most runs are in a repository.
    def execute(self, opts: ExecOptions, registry: Registry) -> Verdict:
        from ccm_guard.copy import exec as copyexec

        return copyexec.exec_copied(opts, registry)

    def apply(self, registry: Registry, task: Task, *, into: str | None, how: str, retries: int) -> Applied:
        if into is not None or how != "merge":
            raise UsageError(f"task {task.id} ran in a copy of a plain directory: it applies back into "
                             f"{task.main_worktree} only, without --into or --strategy")
        from ccm_guard.copy import apply as copyapply

        return copyapply.apply_copy(registry, task)

    def discard(self, registry: Registry, task: Task) -> dict[str, Any]:
        from ccm_guard.copy import apply as copyapply

        return copyapply.discard_copy(registry, task)

    def restore(self, registry: Registry, task: Task) -> dict[str, Any]:
        from ccm_guard.copy import apply as copyapply

        return copyapply.restore_copy(registry, task)


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (LinkedWorktree(), CopiedDirectory())}


def of_task(task: Task) -> Strategy:
    return STRATEGIES[task.strategy]


def execute(opts: ExecOptions, registry: Registry) -> Verdict:
    """`exec`: a linked worktree where the start is in a git repository, else a copy."""
    from ccm_guard.run import exec as runexec

    try:
        return STRATEGIES[LINKED_WORKTREE].execute(opts, registry)
    except runexec.PlainDirectory:
        return STRATEGIES[COPIED_DIRECTORY].execute(opts, registry)


def apply(registry: Registry, task_id: str, *, into: str | None = None, how: str = "merge",
          retries: int | None = None) -> Applied:
    from ccm_guard.worktree import apply as applying

    if retries is None:
        retries = applying.PUSH_RETRIES
    if how not in applying.STRATEGIES:
        raise UsageError(f"unknown strategy {how!r}: choose one of {', '.join(applying.STRATEGIES)}")
    task = registry.get(task_id)
    return of_task(task).apply(registry, task, into=into, how=how, retries=retries)


def discard(registry: Registry, task_id: str) -> dict[str, Any]:
    task = registry.get(task_id)
    return of_task(task).discard(registry, task)


def restore(registry: Registry, task_id: str) -> dict[str, Any]:
    task = registry.get(task_id)
    return of_task(task).restore(registry, task)
