"""What changed between two snapshots, sorted by who may change it.

A normal run changes little: new objects, the task's own branch and reflog, its own
admin dir's index/HEAD/logs. The person (or another task) may change their own state
concurrently; that is told apart from the agent's where git allows and otherwise
reported as a warning. Everything else is the agent's and a finding.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from pathlib import Path
from typing import NamedTuple

from ccm_guard.detect import objects, refdirs
from ccm_guard.detect.snapshot import Snapshot, reflogs_by_presence, with_listings
from ccm_guard.state.pins import Pins


class Owner(enum.Enum):
    OWN = "own"  # the task's normal work
    IN_PROGRESS = "in-progress"  # an operation left half-done in the task's admin dir
    MAIN = "main"  # the person's checkout state (judged by main-checkout)
    OTHER_WORKTREE = "other-worktree"  # another worktree's everyday state
    REFLOG = "reflog"  # judged together with the ref it logs
    CONTROL = "control"  # everything that steers git: the agent may not touch it


# Files every git operation in a worktree may rewrite.
_EVERYDAY = {"index", "logs/HEAD", "COMMIT_EDITMSG", "ORIG_HEAD", "AUTO_MERGE", "FETCH_HEAD"}
# The shared half of a split index (core.splitIndex), which git writes beside the index.
_SHARED_INDEX = re.compile(r"^sharedindex\.[0-9a-f]{40}([0-9a-f]{24})?$")
# The worktree's own stash (under the sandbox `git stash` keeps it there, not on the shared
# refs/stash: prevent/stash.py); what it holds is reported by the clean-tree gate.
_OWN_STASH = {"refs", "refs/worktree", "refs/worktree/stash"}
# State an interrupted merge/rebase/cherry-pick/bisect leaves behind.
_IN_PROGRESS = re.compile(
    r"^(MERGE_(HEAD|MSG|MODE|RR|AUTOSTASH)|CHERRY_PICK_HEAD|REVERT_HEAD|REBASE_HEAD|BISECT_\w+"
    r"|rebase-merge(/.*)?|rebase-apply(/.*)?|sequencer(/.*)?|index\.lock|HEAD\.lock|refs/bisect(/.*)?)$"
)


class FileChange(NamedTuple):
    key: str  # "common/<rel>", "pointer" or "include/<abs path>"
    change: str  # "added", "removed", "modified"
    owner: Owner


class RefChange(NamedTuple):
    ref: str
    before: str | None
    after: str | None


@dataclasses.dataclass
class Delta:
    """What changed in the git metadata between two snapshots."""

    files: list[FileChange]
    refs: list[RefChange]
    objects: objects.ObjectDelta
    main_prefix: str  # where the person's checkout keeps HEAD and index ("common/" ...)

    def of(self, *owners: Owner) -> list[FileChange]:
        return [c for c in self.files if c.owner in owners]

    def changed(self, key: str) -> bool:
        return any(c.key == key for c in self.files)


def compare(before: Snapshot, after: Snapshot, pins: Pins, main_git_dir: Path) -> Delta:
    main_prefix = _prefix_of(main_git_dir, pins.common_dir)
    # Closed ref directories kept by identity: only those whose record changed are put back.
    listed_before, listed_after = refdirs.changed_listings(before.dirs, after.dirs)
    before, after = with_listings(before, listed_before), with_listings(after, listed_after)
    # A kept directory of reflogs holds their contents as of when it was listed, and git
    # appends to a reflog in place: there, reflogs are compared by presence, kind and mode.
    stale = {rel for rel in {*listed_before, *listed_after} if rel.startswith("logs/")}
    before, after = reflogs_by_presence(before, stale), reflogs_by_presence(after, stale)
    differ = set() if before.refs == after.refs else {  # one C comparison where nothing moved (20k tags)
        ref for ref in {*before.refs, *after.refs} if before.refs.get(ref) != after.refs.get(ref)}
    if shadowing := refdirs.unchanged_listings(before.dirs, after.dirs, differ):
        before, after = with_listings(before, shadowing), with_listings(after, shadowing)
    files = []
    for key in sorted(set(before.files) | set(after.files)):
        old, new = before.files.get(key), after.files.get(key)
        if old == new:
            continue
        # "-": a watched file outside the repository (snapshot._record) that does not exist.
        change = ("added" if old is None or old.kind == "-" else "removed" if new is None or new.kind == "-"
                  else "modified")
        files.append(FileChange(key, change, classify(key, change, pins, main_prefix)))
    refs = [RefChange(ref, before.refs.get(ref), after.refs.get(ref)) for ref in sorted(differ)
            if before.refs.get(ref) != after.refs.get(ref)]
    objs = objects.compare(pins.common_dir / "objects", before.objects, after.objects)
    return Delta(files, refs, objs, main_prefix)


def _prefix_of(git_dir: Path, common: Path) -> str:
    if git_dir == common:
        return "common/"
    return f"common/{git_dir.relative_to(common).as_posix()}/"


def _everyday(sub: str, change: str) -> bool:
    """State every git operation in a worktree may change. Git writes a shared index once,
    under its own hash, and never rewrites it: one changed in place (to flag every entry
    assume-unchanged, say, which hides edits from `git status`) is no everyday change."""
    return sub in _EVERYDAY or (_SHARED_INDEX.match(sub) is not None and change != "modified")


def classify(key: str, change: str, pins: Pins, main_prefix: str) -> Owner:
    if not key.startswith("common/"):
        return Owner.CONTROL  # the .git pointer file, include targets
    rel = key[len("common/"):]
    if rel.startswith("lfs/objects/") and change == "added":
        return Owner.OWN  # git-lfs content is added like objects are
    own = f"worktrees/{pins.admin_name}/"
    if rel.startswith(own):
        sub = rel[len(own):]
        if _everyday(sub, change) or sub in _OWN_STASH or sub.startswith("logs/") or sub == "HEAD":
            return Owner.OWN  # HEAD itself is judged by head checks, not here
        return Owner.IN_PROGRESS if _IN_PROGRESS.match(sub) else Owner.CONTROL
    if key.startswith(main_prefix):
        sub = key[len(main_prefix):]
        if _everyday(sub, change) or sub == "HEAD" or _IN_PROGRESS.match(sub) or sub in ("gc.pid", "gc.log"):
            return Owner.MAIN
    if rel.startswith("worktrees/"):
        parts = rel.split("/", 2)
        sub = parts[2] if len(parts) > 2 else ""
        if _everyday(sub, change) or sub == "HEAD" or _IN_PROGRESS.match(sub) or sub.startswith("logs/"):
            return Owner.OTHER_WORKTREE
        return Owner.CONTROL
    if rel.startswith("logs/refs/"):
        return Owner.REFLOG
    return Owner.CONTROL
