"""What installing or uninstalling the guard hooks did, step by step, for the CLI to show."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class Report:
    """What install or uninstall did, for the CLI to render (text, or `to_json`)."""

    target: Path  # the worktree, or the repository's top level
    hooks_dir: Path | None = None  # where ccm-guard's hooks are (were)
    written: list[Path] = dataclasses.field(default_factory=list)  # ccm-guard's files
    kept: list[tuple[Path, Path]] = dataclasses.field(default_factory=list)  # (was, now), chained
    chained: list[str] = dataclasses.field(default_factory=list)  # hooks run first, left in place
    restored: list[Path] = dataclasses.field(default_factory=list)  # put back as they were
    removed: list[Path] = dataclasses.field(default_factory=list)  # ccm-guard's files removed
    config: list[str] = dataclasses.field(default_factory=list)  # "<file>: <change>"
    notes: list[str] = dataclasses.field(default_factory=list)  # what the person should check

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        return json.loads(json.dumps(data, default=str))  # type: ignore[no-any-return]
