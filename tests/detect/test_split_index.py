"""The shared half of a split index (core.splitIndex): git writes `sharedindex.<id>` once
and never rewrites it, so one appearing or going beside an index is everyday state, and
one changed in place is not (flagging every entry assume-unchanged there hides edits from
`git status`)."""

from __future__ import annotations

import os
from pathlib import Path

from conftest import git, run_exec, write_agent

from ccm_guard.detect.delta import Owner, classify
from ccm_guard.detect.snapshot import INDEX_HASH_LIMIT, _read_entry
from ccm_guard.state.pins import Pins

SHARED = "sharedindex." + "ab" * 20


def _pins(tmp_path: Path) -> Pins:
    common = tmp_path / "repo" / ".git"
    return Pins(tmp_path / "wt", common / "worktrees" / "t1", common, "ccm/t1")


def test_a_shared_index_coming_or_going_is_everyday_and_one_rewritten_is_not(tmp_path: Path) -> None:
    pins = _pins(tmp_path)
    for key, everyday in ((f"common/{SHARED}", Owner.MAIN), (f"common/worktrees/other/{SHARED}", Owner.OTHER_WORKTREE),
                          (f"common/worktrees/t1/{SHARED}", Owner.OWN)):
        for change in ("added", "removed"):
            assert classify(key, change, pins, "common/") is everyday, (key, change)
        assert classify(key, "modified", pins, "common/") is Owner.CONTROL, key


def test_a_large_shared_index_is_hashed_not_timed(tmp_path: Path) -> None:
    """Git touches a shared index each time it reads it: that must not read as a change."""
    shared = tmp_path / SHARED
    shared.write_bytes(b"x" * (2 << 20))
    before = _read_entry(shared)
    os.utime(shared, (1, 1))
    assert before is not None and 2 << 20 < INDEX_HASH_LIMIT
    assert _read_entry(shared) == before


def test_an_agent_that_rewrites_the_persons_shared_index_fails_the_run(repo: Path, tmp_path: Path) -> None:
    git(repo, "config", "core.splitIndex", "true")
    git(repo, "update-index", "--split-index")
    shared = next((repo / ".git").glob("sharedindex.*"))
    agent = write_agent(tmp_path, f"""echo work > work.txt; git add work.txt; git commit -q -m work
printf 'tampered' | dd of={shared} bs=1 seek=20 conv=notrunc 2>/dev/null""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.code != 0
    assert res.status("git-metadata") == "fail" and shared.name in res.stdout, res.stdout
