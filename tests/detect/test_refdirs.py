"""Ref directories closed to a sandboxed agent, kept by identity (detect/refdirs.py): what
changed in them is still told exactly, ref by ref, and what did not is not read at all."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from conftest import git, make_repo, spawn_exec, write_agent

from ccm_guard.detect import refdirs
from ccm_guard.detect.delta import compare
from ccm_guard.detect.snapshot import take
from ccm_guard.digest import sha256_hex
from ccm_guard.prevent import sandbox
from ccm_guard.state.pins import Pins

MANY = refdirs.SMALL + 36


def _branches(repo: Path, count: int, prefix: str = "bench") -> None:
    lines = "".join(f"create refs/heads/{prefix}/r{i:04d} HEAD\n" for i in range(count))
    subprocess.run(["git", "-c", "core.logAllRefUpdates=true", "update-ref", "-m", "branch: Created from HEAD", "--stdin"],
                   cwd=repo, input=lines,
                   text=True, check=True)


@pytest.fixture
def task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Pins]:
    """A repository with MANY branches under refs/heads/bench/ and a task worktree; the
    listings are stored however fresh the directories are (the two-second rule is the
    racy check's, tested on its own)."""
    monkeypatch.setattr(refdirs, "_SETTLE_NS", 0)
    repo = make_repo(tmp_path / "repo")
    _branches(repo, MANY)
    git(repo, "worktree", "add", "-q", "-b", "ccm/t1", str(tmp_path / "wt"))
    common = repo / ".git"
    time.sleep(0.05)  # a later change gets a later change time than the listing saw
    return repo, Pins(tmp_path / "wt", common / "worktrees" / "wt", common, "ccm/t1")


def test_a_closed_directory_left_alone_is_kept_by_identity_and_not_read(task: tuple[Path, Pins]) -> None:
    repo, pins = task
    before = take(pins, sandboxed=True)
    assert set(before.dirs) == {"refs/heads/bench", "logs/refs/heads/bench"}
    assert not any(ref.startswith("refs/heads/bench/") for ref in before.refs)
    assert not any(key.startswith("common/logs/refs/heads/bench/") for key in before.files)
    assert before.refs["refs/heads/ccm/t1"] == git(repo, "rev-parse", "HEAD")  # the open directory, read in full
    after = take(pins, previous=before)
    assert after.dirs == before.dirs
    delta = compare(before, after, pins, pins.common_dir)
    assert delta.refs == [] and delta.files == []


def test_a_change_in_a_closed_directory_is_told_ref_by_ref(task: tuple[Path, Pins]) -> None:
    repo, pins = task
    head = git(repo, "rev-parse", "HEAD")
    before = take(pins, sandboxed=True)
    git(repo, "commit", "-q", "--allow-empty", "-m", "other")
    other = git(repo, "rev-parse", "HEAD")
    git(repo, "update-ref", "refs/heads/bench/r0003", other)
    git(repo, "update-ref", "-d", "refs/heads/bench/r0004")
    git(repo, "update-ref", "refs/heads/bench/new", other)
    after = take(pins, previous=before)
    assert after.dirs["refs/heads/bench"] != before.dirs["refs/heads/bench"]
    delta = compare(before, after, pins, pins.common_dir)
    bench = sorted((rc.ref, rc.before, rc.after) for rc in delta.refs if rc.ref.startswith("refs/heads/bench/"))
    assert bench == [("refs/heads/bench/new", None, other), ("refs/heads/bench/r0003", head, other),
                     ("refs/heads/bench/r0004", head, None)]
    reflogs = {(c.key, c.change) for c in delta.files if c.key.startswith("common/logs/refs/heads/bench/")}
    # r0003's reflog grew in place with its move: in a kept directory reflogs are compared
    # by presence, kind and mode (the move itself is told above).
    assert reflogs == {("common/logs/refs/heads/bench/new", "added"), ("common/logs/refs/heads/bench/r0004", "removed")}


def test_a_listing_gone_from_the_store_shows_as_a_change_not_as_nothing(task: tuple[Path, Pins]) -> None:
    repo, pins = task
    before = take(pins, sandboxed=True)
    for listing in refdirs.store_dir().glob("*-*.json"):
        listing.write_text("{}")  # altered: its digest no longer holds
    git(repo, "update-ref", "-d", "refs/heads/bench/r0001")
    after = take(pins, previous=before)
    delta = compare(before, after, pins, pins.common_dir)
    assert ("common/refs/heads/bench/", "removed") in {(c.key, c.change) for c in delta.files}


def test_without_the_sandbox_every_ref_is_read(task: tuple[Path, Pins]) -> None:
    _, pins = task
    snap = take(pins)
    assert snap.dirs == {} and snap.open_refs is None
    assert sum(ref.startswith("refs/heads/bench/") for ref in snap.refs) == MANY


def test_the_agents_own_ref_directory_is_always_read_in_full(task: tuple[Path, Pins]) -> None:
    repo, pins = task
    _branches(repo, MANY, prefix="ccm/sibling")  # refs/heads/ccm/sibling/: below the open directory
    time.sleep(0.05)
    snap = take(pins, sandboxed=True)
    assert not any(rel.startswith(("refs/heads/ccm", "logs/refs/heads/ccm")) for rel in snap.dirs)
    assert sum(ref.startswith("refs/heads/ccm/sibling/") for ref in snap.refs) == MANY


def test_a_directory_changed_in_the_last_two_seconds_is_not_kept(task: tuple[Path, Pins],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    _, pins = task
    monkeypatch.setattr(refdirs, "_SETTLE_NS", 2_000_000_000)  # as it is outside these tests
    snap = take(pins, sandboxed=True)
    assert "refs/heads/bench" not in snap.dirs  # made a moment ago: a change in the same tick could hide
    assert sum(ref.startswith("refs/heads/bench/") for ref in snap.refs) == MANY


@pytest.mark.skipif(sandbox.abi() == 0, reason="this kernel has no Landlock")
def test_a_sandboxed_run_names_a_ref_moved_in_a_closed_directory_meanwhile(tmp_path: Path) -> None:
    """End to end, with the store's two-second rule as shipped: a branch among many moved
    by someone outside the sandbox while the agent ran is named, with where it went."""
    repo = make_repo(tmp_path / "repo")
    _branches(repo, MANY)
    time.sleep(2.2)  # settled: the run's baseline keeps refs/heads/bench/ by identity
    gate = tmp_path / "go"
    agent = write_agent(tmp_path, f'touch "$TMPDIR/started"; while [ ! -e {gate} ]; do sleep 0.05; done')
    proc = spawn_exec(repo, "--json", "--no-require-commit", "--task", "t1", "--", str(agent))
    try:
        deadline = time.monotonic() + 60
        while not list((tmp_path / "state").rglob("started")):
            assert time.monotonic() < deadline and proc.poll() is None, "the agent did not start"
            time.sleep(0.05)
        git(repo, "commit", "-q", "--allow-empty", "-m", "meanwhile")
        git(repo, "update-ref", "refs/heads/bench/r0007", "HEAD")
    finally:
        gate.touch()
        out, err = proc.communicate(timeout=60)
    assert len(list((tmp_path / "state" / "refdirs").glob("*-*.json"))) >= 2, "nothing was kept by identity"
    verdict = json.loads(out)
    failed = {g["name"]: g for g in verdict["gates"] if g["status"] == "fail"}
    assert set(failed) == {"refs-untouched"}, (failed, err)
    assert "refs/heads/bench/r0007 moved" in out, out


def test_bad_records_in_the_index_are_ignored(tmp_path: Path) -> None:
    index = tmp_path / "index.json"
    stem = "0" * 16 + "-" + "a" * 64
    index.write_text(json.dumps({"refs": ["1:2:3", "not a list", "x"], "refs/x": ["1", [], stem], "refs/y": "z",
                                 "refs/z": ["1", ["../up"], stem], "refs/w": ["1", [], "../../evil"]}))
    assert refdirs._load_index(index) == {"refs/x": ["1", [], stem]}
    index.write_text("[")
    assert refdirs._load_index(index) == {}
    assert os.path.exists(index)


def test_a_packed_value_under_a_loose_one_in_a_closed_directory_is_no_change(task: tuple[Path, Pins]) -> None:
    """Git reads the loose file over packed-refs: a packed value under it that changes
    (the file written by hand here) moved nothing, kept by identity or not."""
    repo, pins = task
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "commit", "-q", "--allow-empty", "-m", "other")
    other = git(repo, "rev-parse", "HEAD")
    packed = pins.common_dir / "packed-refs"
    packed.write_text(f"# pack-refs with: peeled fully-peeled sorted \n{head} refs/heads/bench/r0005\n")
    time.sleep(0.05)
    before = take(pins, sandboxed=True)
    assert "refs/heads/bench" in before.dirs
    packed.write_text(f"# pack-refs with: peeled fully-peeled sorted \n{other} refs/heads/bench/r0005\n")
    after = take(pins, previous=before)
    assert after.dirs["refs/heads/bench"] == before.dirs["refs/heads/bench"]
    assert compare(before, after, pins, pins.common_dir).refs == []


def test_reflogs_rewritten_with_the_same_lines_are_no_change(task: tuple[Path, Pins]) -> None:
    """`git reflog expire` (which gc runs) rewrites every reflog as a new file with the same
    lines: in a closed directory as anywhere, that changed nothing."""
    repo, pins = task
    git(repo, "branch", "side")
    time.sleep(0.05)
    before = take(pins, sandboxed=True)
    git(repo, "reflog", "expire", "--all", "--expire=never", "--expire-unreachable=never")
    assert take(pins, sandboxed=True).dirs["logs/refs/heads/bench"] != before.dirs["logs/refs/heads/bench"]  # new files
    after = take(pins, previous=before)
    assert [c for c in compare(before, after, pins, pins.common_dir).files if "logs/refs/" in c.key] == []


def test_a_mode_changed_in_a_small_closed_directory_is_seen(task: tuple[Path, Pins]) -> None:
    """Landlock does not govern chmod: a directory listed in the snapshot itself records
    each file's mode, as it did before directories were kept by identity."""
    repo, pins = task
    before = take(pins, sandboxed=True)
    (pins.common_dir / "logs/refs/heads/main").chmod(0o444)
    after = take(pins, previous=before)
    changed = {(c.key, c.change) for c in compare(before, after, pins, pins.common_dir).files}
    assert ("common/logs/refs/heads/main", "modified") in changed


def test_a_listing_in_use_is_not_pruned(task: tuple[Path, Pins]) -> None:
    """A listing made long ago that a run's baseline uses survives that run's own after
    snapshot replacing it in the index: use marks it."""
    repo, pins = task
    take(pins, sandboxed=True)  # stores the listings
    old = time.time() - 30 * 86400
    for listing in refdirs.store_dir().glob("*-*.json"):
        os.utime(listing, (old, old))
    before = take(pins, sandboxed=True)
    git(repo, "update-ref", "-d", "refs/heads/bench/r0004")
    after = take(pins, previous=before)
    delta = compare(before, after, pins, pins.common_dir)
    assert [rc.ref for rc in delta.refs if rc.ref.startswith("refs/heads/bench/")] == ["refs/heads/bench/r0004"]
    assert not any(c.key.endswith("/") for c in delta.files)


def test_a_forged_index_cannot_hide_the_open_directory(task: tuple[Path, Pins]) -> None:
    """The store's index says which subdirectories a closed directory has; the agent's own
    ref directory is walked by its name whatever the index says."""
    repo, pins = task
    git(repo, "branch", "ccm/other")
    before = take(pins, sandboxed=True)
    index = next(p for p in refdirs.store_dir().glob("*.json") if "-" not in p.name)
    records = json.loads(index.read_text())
    st = os.lstat(pins.common_dir / "refs/heads")
    for listing in refdirs.store_dir().glob("*-*.json"):
        records["refs/heads"] = [refdirs._identity(st), ["bench"], listing.stem]  # hides ccm/
        break
    index.write_text(json.dumps(records))
    git(repo, "update-ref", "refs/heads/ccm/other", git(repo, "commit-tree", "-m", "x", "HEAD^{tree}"))
    after = take(pins, previous=before)
    assert "refs/heads/ccm/other" in [rc.ref for rc in compare(before, after, pins, pins.common_dir).refs]


def test_a_listing_that_is_not_one_is_refused(tmp_path: Path) -> None:
    refdirs.store_dir().mkdir(parents=True)
    data = json.dumps({"subdirs": [], "entries": {"common/logs/x": "not an entry"}, "locks": [], "idents": {},
                       "taken_at": 0}).encode()
    stem = "0" * 16 + "-" + sha256_hex(data)
    (refdirs.store_dir() / f"{stem}.json").write_bytes(data)
    assert refdirs.load(f"1:2:3 {stem}", logs=True) is None
    assert refdirs.load(f"1:2:3 {stem}", logs=False) is not None
    assert refdirs.load("1:2:3 ../../x", logs=False) is None


def test_reflogs_appended_to_since_their_listing_are_no_change_when_the_directory_changes(
        task: tuple[Path, Pins]) -> None:
    """A kept listing holds reflogs as they were when it was made; git appends to a reflog
    in place, which changes no directory. When someone then changes the directory during
    a run (a new branch, a reflog expire), those appends are not the run's."""
    repo, pins = task
    take(pins, sandboxed=True)  # the listing, made now
    for name in ("r0001", "r0002"):
        git(repo, "update-ref", "-m", "person", f"refs/heads/bench/{name}", "HEAD")  # appended in place
    before = take(pins, sandboxed=True)
    assert "logs/refs/heads/bench" in before.dirs  # kept: the appends changed no directory
    git(repo, "branch", "bench/zz-new")
    git(repo, "reflog", "expire", "--all", "--expire=never", "--expire-unreachable=never")
    after = take(pins, previous=before)
    changed = {(c.key, c.change) for c in compare(before, after, pins, pins.common_dir).files if "/bench/" in c.key}
    assert changed == {("common/logs/refs/heads/bench/zz-new", "added")}


def test_a_listing_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    refdirs.store_dir().mkdir(parents=True)
    data = json.dumps({"subdirs": 3, "entries": [], "locks": [], "idents": [], "taken_at": 0}).encode()
    stem = "0" * 16 + "-" + sha256_hex(data)
    (refdirs.store_dir() / f"{stem}.json").write_bytes(data)
    assert refdirs.load(f"1:2:3 {stem}", logs=True) is None


def test_what_no_snapshot_used_for_a_week_is_swept(task: tuple[Path, Pins], tmp_path: Path) -> None:
    """A repository that is gone leaves its listings behind: a listing unused for a week
    goes when any run stores one, and an index with no listing left goes with it."""
    repo, pins = task
    take(pins, sandboxed=True)
    store = refdirs.store_dir()
    old_stem = "f" * 16 + "-" + "0" * 64
    (store / f"{old_stem}.json").write_text("{}")
    (store / ("f" * 16 + ".json")).write_text(json.dumps({"refs/x": ["1:2:3", [], old_stem]}))
    week_ago = time.time() - 8 * 86400
    os.utime(store / f"{old_stem}.json", (week_ago, week_ago))
    _branches(repo, MANY, prefix="more")  # a new directory to store
    time.sleep(0.05)
    take(pins, sandboxed=True)
    assert not (store / f"{old_stem}.json").exists() and not (store / ("f" * 16 + ".json")).exists()
    assert len(list(store.glob("*-*.json"))) >= 3  # this repository's, in use, stay
