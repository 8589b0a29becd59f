"""A task's places, recorded once when it is created and trusted from then on."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

# ccm-guard's own refs in the repository: a task's archived work, and its snapshots.
BRANCH_PREFIX = "ccm/"  # every task's branch is refs/heads/ccm/<task>
ARCHIVE_PREFIX = "refs/ccm-guard/archive/"
SNAPSHOT_PREFIX = "refs/ccm-guard/snapshots/"


class Pins(NamedTuple):
    """Absolute paths recorded when the task was created, before the agent existed."""

    worktree: Path
    admin_dir: Path
    common_dir: Path
    branch: str  # the task's branch, short name (ccm/<task>)

    @property
    def admin_name(self) -> str:
        return self.admin_dir.name

    @property
    def branch_ref(self) -> str:
        return f"refs/heads/{self.branch}"
