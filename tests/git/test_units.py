"""Small pieces on their own: config keys, object checks, refs, classification, rendering."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from conftest import git as gitcmd
from conftest import make_repo
from pytest_subprocess import FakeProcess

from ccm_guard import git
from ccm_guard import text as report
from ccm_guard.agent.options import ExecOptions
from ccm_guard.detect import objects, snapshot
from ccm_guard.detect.delta import Owner, classify
from ccm_guard.errors import GitError, RepoError, StateError, UntrustedRepoError, UsageError
from ccm_guard.git import base as base_module
from ccm_guard.git import config as configfile
from ccm_guard.git import core
from ccm_guard.git.history import range_log
from ccm_guard.run.exec import exec_task
from ccm_guard.state.pins import Pins
from ccm_guard.state.registry import Registry, sanitise_task_id


@pytest.mark.parametrize("key, value, dangerous", [
    ("core.hooksPath", "/x", True),
    ("CORE.FSMONITOR", "x", True),
    ("core.sshCommand", "ssh -i k", True),
    ("filter.lfs.clean", "git-lfs clean", True),
    ("filter.Weird.Name.smudge", "x", True),
    ("merge.ours.driver", "true", True),
    ("diff.pdf.textconv", "pdftotext", True),
    ("alias.st", "status", False),
    ("alias.pwn", "!sh -c 'id'", True),
    ("alias.lg", "-c core.pager=evil log", True),
    ("includeIf.gitdir:/x/.path", "/tmp/inc", True),
    ("credential.https://example.com.helper", "store", True),
    ("uploadpack.packObjectsHook", "x", True),
    ("user.name", "Mallory", False),
    ("core.autocrlf", "true", False),
    ("remote.origin.url", "ext::sh -c id", True),
    # git archive, send-email, ssh signing, the tools' own paths, LFS agents, templates for new clones
    ("tar.tgz.command", "sh -c id", True),
    ("sendemail.sendmailCmd", "x", True),
    ("gpg.ssh.defaultKeyCommand", "sh -c id", True),
    ("mergetool.vim.path", "/x", True),
    ("difftool.x.path", "/x", True),
    ("man.x.path", "/x", True),
    ("browser.x.path", "/x", True),
    ("lfs.customtransfer.x.path", "/x", True),
    ("init.templateDir", "/x", True),
    ("gpg.ssh.allowedSignersFile", "/x", False),
])
def test_dangerous_keys(key: str, value: str, dangerous: bool) -> None:
    assert configfile.is_dangerous(key, value) is dangerous


def test_config_diff_key_by_key() -> None:
    before = b"[core]\n\tbare = false\n[user]\n\tname = A\n"
    after = b"[core]\n\tbare = false\n\thooksPath = /tmp/h\n[user]\n\tname = B\n[alias]\n\tx = !id\n"
    changes = {c.key: c for c in configfile.diff(before, after)}
    assert set(changes) == {"core.hookspath", "user.name", "alias.x"}
    assert changes["core.hookspath"].dangerous and changes["alias.x"].dangerous
    assert not changes["user.name"].dangerous
    assert changes["user.name"].describe() == "user.name: 'A' -> 'B'"


def test_unparseable_config_is_one_dangerous_change() -> None:
    (change,) = configfile.diff(b"[core]\n", b"[core\n\tbroken")
    assert change.dangerous and change.key == "(unparseable config)"


def test_include_targets_are_resolved_relative_to_the_config(tmp_path: Path) -> None:
    cfg = tmp_path / "config"
    data = b"[include]\n\tpath = extra.inc\n[includeIf \"gitdir:/x/\"]\n\tpath = /abs/other\n"
    assert configfile.include_targets(cfg, data) == [tmp_path / "extra.inc", Path("/abs/other")]
    assert configfile.include_targets(cfg, b"[core]\n\tbare = false\n") == []


def _loose(objects_dir: Path, payload: bytes) -> Path:
    raw = b"blob %d\0" % len(payload) + payload
    oid = hashlib.sha1(raw).hexdigest()
    path = objects_dir / oid[:2] / oid[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zlib.compress(raw))
    return path


def test_object_freshening_is_not_a_change_but_a_rewrite_is(tmp_path: Path) -> None:
    objs = tmp_path / "objects"
    path = _loose(objs, b"hello\n")
    before = objects.inventory(objs)
    os.utime(path, ns=(1, 1))  # what git's freshening does
    assert objects.compare(objs, before, objects.inventory(objs)).altered == []
    forged = zlib.compress(b"blob 6\0evil!\n")
    path.write_bytes(forged)
    delta = objects.compare(objs, before, objects.inventory(objs))
    assert delta.altered == [f"{path.parent.name}/{path.name}"]
    path.unlink()
    assert objects.compare(objs, before, objects.inventory(objs)).removed == [f"{path.parent.name}/{path.name}"]


def test_apply_hashes_a_freshened_pack_and_asks_git_only_of_a_written_index(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pack git freshened since a task began costs a hash, not a `git verify-pack` of
    every object in it (seconds on a large repository, at every apply after another
    task's commit); a pack whose index was written too is git's to verify."""
    gitcmd(repo, "gc", "-q")
    objs = repo / ".git/objects"
    pack = next((objs / "pack").glob("pack-*.pack"))
    idx = pack.with_suffix(".idx")
    since = time.time()
    written, old = (1, 1, 1, int((since + 10) * 1e9)), (1, 1, 1, 0)

    def forged(*, index_written: bool, verifies: bool = True) -> list[str]:
        def verify_pack(i: Path, fmt: str = "sha1") -> bool:
            asked.append(i)
            return verifies

        monkeypatch.setattr(objects, "inventory", lambda d: {f"pack/{pack.name}": written,
                                                              f"pack/{idx.name}": written if index_written else old})
        monkeypatch.setattr(git, "verify_pack", verify_pack)
        return objects.forged_since(objs, since)

    asked: list[Path] = []
    assert forged(index_written=False) == [] and asked == []  # freshened: hashed, no git
    assert forged(index_written=True) == [] and asked == [idx]
    asked.clear()
    pack.chmod(0o644)
    data = bytearray(pack.read_bytes())
    data[-1] ^= 1  # the bytes no longer hash to the name: git verifies
    pack.write_bytes(bytes(data))
    assert forged(index_written=False, verifies=False) == [f"pack/{idx.name}"] and asked == [idx]


def test_a_changed_pack_must_hash_to_its_name(tmp_path: Path) -> None:
    """Git names a pack after the checksum it ends in: a .pack whose bytes still hash to
    its name is the one git wrote (freshened); a checksum made good again is not enough
    when the name says otherwise, and a pack named otherwise (no index) is no proof."""
    body = b"PACK" + b"\0" * 40
    trailer = hashlib.sha1(body).digest()
    pack = tmp_path / "pack" / f"pack-{trailer.hex()}.pack"
    pack.parent.mkdir()
    pack.write_bytes(body + trailer)
    assert objects.verify(pack, pack.stat().st_size, kept=lambda rel: False)
    assert objects.holds_its_name(pack)
    other = b"PACK" + b"\1" * 40
    pack.write_bytes(other + hashlib.sha1(other).digest())  # same size, a checksum that holds
    assert not objects.verify(pack, pack.stat().st_size, kept=lambda rel: False)
    named = pack.with_name("pack-x.pack")
    named.write_bytes(body + trailer)
    assert not objects.verify(named, named.stat().st_size, kept=lambda rel: False)


def test_refs_are_read_from_packed_and_loose_files_with_their_type(tmp_path: Path) -> None:
    common = tmp_path
    (common / "refs/heads").mkdir(parents=True)
    (common / "packed-refs").write_text("# pack-refs with: peeled\n" + "a" * 40 + " refs/heads/old\n"
                                        + "b" * 40 + " refs/tags/v1\n^" + "c" * 40 + "\n")
    (common / "refs/heads/old").write_text("d" * 40 + "\n")  # loose wins
    (common / "refs/heads/sym").write_text("ref: refs/heads/main\n")
    os.symlink("elsewhere", common / "refs/heads/link")
    refs = snapshot.read_refs(common)
    assert refs == {"refs/heads/old": "d" * 40, "refs/tags/v1": "b" * 40, "refs/tags/v1^{}": "c" * 40,
                    "refs/heads/sym": "ref: refs/heads/main", "refs/heads/link": "symlink: elsewhere"}


@pytest.mark.parametrize("key, owner", [
    ("common/worktrees/t1/index", Owner.OWN),
    ("common/worktrees/t1/logs/HEAD", Owner.OWN),
    ("common/worktrees/t1/MERGE_HEAD", Owner.IN_PROGRESS),
    ("common/worktrees/t1/rebase-merge/git-rebase-todo", Owner.IN_PROGRESS),
    ("common/worktrees/t1/config.worktree", Owner.CONTROL),
    ("common/worktrees/t1/commondir", Owner.CONTROL),
    ("common/worktrees/other/index", Owner.OTHER_WORKTREE),
    ("common/worktrees/other/gitdir", Owner.CONTROL),
    ("common/index", Owner.MAIN),
    ("common/HEAD", Owner.MAIN),
    ("common/MERGE_HEAD", Owner.MAIN),
    ("common/logs/refs/heads/main", Owner.REFLOG),
    ("common/config", Owner.CONTROL),
    ("common/hooks/pre-commit", Owner.CONTROL),
    ("common/info/exclude", Owner.CONTROL),
    ("common/objects/info/alternates", Owner.CONTROL),
    ("pointer", Owner.CONTROL),
])
def test_changes_are_classified_by_owner(key: str, owner: Owner) -> None:
    pins = Pins(Path("/wt/t1"), Path("/repo/.git/worktrees/t1"), Path("/repo/.git"), "ccm/t1")
    assert classify(key, "modified", pins, "common/") is owner


def test_control_characters_and_bidi_overrides_are_escaped() -> None:
    assert report.safe("ok\x1b[2Jgone\u202eevil\n") == "ok\\x1b[2Jgone\\u202eevil\\x0a"
    assert report.safe("plain/path.py") == "plain/path.py"


@pytest.mark.parametrize("raw, clean", [
    ("fix-login", "fix-login"),
    ("a b/c", "a-b-c"),
    ("..hidden", "hidden"),
    ("x.lock", "x-lock"),
    ("ünïcode", "n-code"),
])
def test_task_ids_are_sanitised(raw: str, clean: str) -> None:
    assert sanitise_task_id(raw) == clean


def test_task_id_with_nothing_usable_is_refused() -> None:
    with pytest.raises(UsageError, match="no usable characters"):
        sanitise_task_id("///")


def test_illegal_lifecycle_transition_is_refused(repo: Path) -> None:
    registry = Registry()
    exec_task(ExecOptions(command=["true"], start=repo, task="life", terminal=False, require_commit=False), registry)
    assert registry.get("life").status == "COMMITTED"
    with pytest.raises(StateError, match="cannot go from COMMITTED to PENDING"):
        registry.move("life", "PENDING")


def test_failing_disk_during_worktree_add_leaves_nothing(repo: Path, fp: FakeProcess) -> None:
    """git reports ENOSPC half-way: the error names git's own words, nothing is left behind."""
    fp.allow_unregistered(True)
    fp.keep_last_process(True)
    fp.register([git.binary(), fp.any(min=1), "worktree", "add", fp.any()],
                stderr="fatal: could not create leading directories of '/x/.git': No space left on device\n",
                returncode=128)
    registry = Registry()
    with pytest.raises(GitError, match="No space left on device"):
        exec_task(ExecOptions(command=["true"], start=repo, task="enospc", terminal=False), registry)
    assert registry.list(live_only=False) == []
    assert list(Path(os.environ["CCM_GUARD_HOME"]).glob("worktrees/*/enospc")) == []
    assert gitcmd(repo, "for-each-ref", "refs/heads/ccm/") == ""


@pytest.mark.parametrize("version", ["2", "3", "4"])
def test_index_sizes_match_the_files(repo: Path, version: str) -> None:
    from ccm_guard.git import index as indexfile

    (repo / "docs").mkdir()
    (repo / "docs/a much longer name for prefix compression.txt").write_text("x" * 1234)
    (repo / "docs/a much longer name for prefix compression 2.txt").write_text("y" * 10)
    gitcmd(repo, "add", "-A")
    gitcmd(repo, "update-index", "--index-version", version)
    if version == "3":
        gitcmd(repo, "update-index", "--skip-worktree", "--", "README.md")  # an extended flag
    files = gitcmd(repo, "ls-files", "-z").split("\0")
    expected = sum((repo / f).stat().st_size for f in files if f)
    assert indexfile.sizes(repo / ".git/index") == (len([f for f in files if f]), expected)


def test_index_that_is_not_one_is_refused(tmp_path: Path) -> None:
    from ccm_guard.git import index as indexfile

    (tmp_path / "index").write_bytes(b"DIRC\0\0\0\2\0\0\0\5garbage")
    assert indexfile.sizes(tmp_path / "index") is None
    assert indexfile.sizes(tmp_path / "missing") is None


def test_pack_index_names_are_read(repo: Path) -> None:
    gitcmd(repo, "repack", "-a", "-d", "-q")
    (idx,) = (repo / ".git/objects/pack").glob("*.idx")
    names = objects.pack_names(idx, 20)
    assert gitcmd(repo, "rev-parse", "HEAD") in names
    assert len(names) == len(gitcmd(repo, "rev-list", "--objects", "--all").splitlines())
    assert git.verify_pack(idx)


@pytest.mark.parametrize("name", [
    "ccm/20261124-162138-50cd", "ccm/a.b", "a/b_c.d", "x.y.z", "HEAD", "ccm/HEAD", "ccm/a.lock", "a.lock/b",
    "a..b", "-a", "ccm/-a", "ccm/.a", "a/", "/a", "a//b", "@", "a@{b", "a b", "a~b", "a^b", "a:b", "a\\b",
    "a?", "a*", "a[b", "ccm/\u00e9", "a.", "ccm/a.", "_a/_b", "ccm/a-lock",
])
def test_branch_names_are_judged_as_git_judges_them(name: str) -> None:
    by_git = subprocess.run(["git", "check-ref-format", "--branch", name], capture_output=True).returncode == 0
    assert git.check_branch_name(name) == by_git


def test_every_sanitised_task_branch_is_valid_without_asking_git(fp: FakeProcess) -> None:
    # No git process is registered with the fake: a call to git would fail the test.
    for raw in ("fix the bug!", "..a..b..", "x.lock", "-dash-", "a" * 80, "é-ü-x", "ccm/nested/id", "_under"):
        assert git.check_branch_name("ccm/" + sanitise_task_id(raw))


def test_the_lean_git_start_feeds_a_large_input_while_reading_a_large_output(repo: Path) -> None:
    """git.base.start writes stdin while draining stdout: `cat-file --batch` answers more
    than it is asked, and a blocking write would wait for git while git waits for us."""
    from ccm_guard.git import base

    (repo / "blob.txt").write_text("x" * 100 + "\n")
    blob = gitcmd(repo, "hash-object", "-w", "blob.txt")
    count = 20000  # ~800 KB asked, ~2.6 MB answered: far past any pipe's buffer
    code, out, err = base.start(["cat-file", "--batch"], cwd=str(repo), env=base.environment(),
                                input=f"{blob}\n".encode() * count)
    assert code == 0, err
    assert len(base.batch_contents(out)) == 1 and out.count(b"\n" + b"x" * 100) == count


def test_commit_changes_reads_every_entry_of_every_commit_as_git_wrote_it(repo: Path) -> None:
    """The raw diff is taken apart in slices, not token by token: a path named like a commit
    header or like an entry, one with spaces or a newline, an empty commit between two, a
    deletion and an addition (null ids) all come out as git listed them."""
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    odd = ["commit 0123456789abcdef0123456789abcdef01234567", ":100644 100644 a b M", "with space.txt",
           "new\nline.txt"]
    for name in odd:
        (repo / name).write_text("x\n")
    gitcmd(repo, "add", "-A")
    gitcmd(repo, "commit", "-q", "-m", "odd names")
    gitcmd(repo, "commit", "-q", "--allow-empty", "-m", "empty")
    os.remove(repo / "with space.txt")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(repo / "run.sh", 0o755)
    gitcmd(repo, "add", "-A")
    gitcmd(repo, "commit", "-q", "-m", "second")
    handle = git.discover(repo).repo()
    first, _, second = gitcmd(repo, "rev-list", "--reverse", f"{base}..HEAD").split()
    changes = git.commit_changes(handle, base, "HEAD")
    assert sorted((c.where, c.path, c.status) for c in changes) == sorted(
        [(first, name, "A") for name in odd] + [(second, "with space.txt", "D"), (second, "run.sh", "A")])
    by_path = {(c.where, c.path): c for c in changes}
    added, gone = by_path[(first, odd[0])], by_path[(second, "with space.txt")]
    assert (added.old_mode, added.new_mode, added.old_blob) == ("000000", "100644", None)
    assert added.new_blob == gitcmd(repo, "rev-parse", f"{first}:{odd[0]}").strip()
    assert (gone.new_mode, gone.new_blob, gone.old_blob) == ("000000", None, added.new_blob)
    assert by_path[(second, "run.sh")].new_mode == "100755"


def _odd_history(repo: Path) -> str:
    """Commits whose raw diffs hold every shape a batch may be cut inside: names in several
    scripts and one not UTF-8, names like a header or an entry, a merge (a diff against
    each parent), an empty commit, deletions and additions. Returns the base."""
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    gitcmd(repo, "checkout", "-q", "-b", "side")
    for name in ("commit 0123456789abcdef0123456789abcdef01234567", ":100644 100644 a b M", "zoë/ünï.txt",
                 "日本語 パス.txt", "new\nline.txt", "a" * 200):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("x\n")
    (repo / os.fsdecode(b"raw-\xff.txt")).write_text("x\n")
    gitcmd(repo, "add", "-A")
    gitcmd(repo, "commit", "-q", "-m", "odd names")
    gitcmd(repo, "checkout", "-q", "main")
    (repo / "README.md").write_text("changed\n")
    gitcmd(repo, "commit", "-q", "-am", "main moves")
    gitcmd(repo, "merge", "-q", "--no-edit", "side")
    gitcmd(repo, "commit", "-q", "--allow-empty", "-m", "empty")
    os.remove(repo / "zoë/ünï.txt")
    gitcmd(repo, "add", "-A")
    gitcmd(repo, "commit", "-q", "-m", "remove one")
    return base


def test_a_range_read_in_batches_of_any_size_comes_out_as_read_whole(repo: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """git's output is parsed as it arrives (core.run_z): cut after any byte, inside a
    character, an entry or a commit header, the changes are the ones a parse of the whole
    output finds, token for token."""
    base = _odd_history(repo)
    handle = git.discover(repo).repo()
    whole = base_module.raw_changes(git.run(range_log(base, "HEAD"), handle).out.split("\0"), "", git.RawChange)
    # Seven odd names, again in the merge against main; README in main and in the merge against side; the removal.
    assert len(whole) == 7 + 7 + 1 + 1 + 1
    for size in (1, 2, 7, 61, 4096):
        monkeypatch.setattr(core, "_BATCH", size)
        assert git.commit_changes(handle, base, "HEAD") == whole, size


def test_tokens_cut_into_batches_anywhere_parse_as_a_whole() -> None:
    """The parser alone, on a two-commit output cut at every point into two and three batches."""
    tokens = ["", "commit " + "a" * 40, "\n:000000 100644 " + "0" * 40 + " " + "1" * 40 + " A", "x y",
              ":100644 100755 " + "1" * 40 + " " + "2" * 40 + " M", "commit b", "",
              "commit " + "c" * 40, "\n:100644 000000 " + "2" * 40 + " " + "0" * 40 + " D", ":1 2 3 4 M", ""]
    whole = base_module.raw_changes(tokens, "", tuple)
    assert [c[0] for c in whole] == ["x y", "commit b", ":1 2 3 4 M"]
    assert whole[0][4] is None and whole[2][5] is None and whole[2][6] == "c" * 40
    for i in range(len(tokens) + 1):
        for j in range(i, len(tokens) + 1):
            batches = [tokens[:i], tokens[i:j], tokens[j:]]
            assert base_module.raw_changes_batched(batches, "", tuple) == whole, (i, j)
    # A header where an entry's meta belongs is refused wherever the output is cut.
    meta = ":100644 100644 " + "1" * 40 + " " + "2" * 40 + " M"
    bad = ["", "commit " + "a" * 40, "\n" + meta, "p1", "commit " + "b" * 40, "\n" + meta, "p2", ""]
    for i in range(len(bad) + 1):
        with pytest.raises(ValueError, match="unexpected raw diff output"):
            base_module.raw_changes_batched([bad[:i], bad[i:]], "", tuple)


_META = ":100644 100755 " + "1" * 40 + " " + "0" * 40 + " D"
# Metas git never writes: four fields, six, the colon misplaced, a field a digit short
# and the next one long (each as wide as a real one where it can be), a newline inside.
_MALFORMED = [":100644 100644 " + "1" * 40 + " M", ":100644 100644 100644 " + "1" * 40 + " " + "2" * 40 + " M",
              "100644 100644 " + "1" * 40 + " " + "2" * 40 + " :M", ":10064 1006440 " + "1" * 40 + " " + "2" * 40 + " M",
              ":100644 100644 " + "1" * 39 + " " + "2" * 41 + " M", ":100644\n100644 " + "1" * 40 + " " + "2" * 40 + " M"]
_TOKENS = st.lists(st.sampled_from(["", "commit " + "a" * 40, "commit b", "\n" + _META, _META, "p", "commit x y",
                                    ":1 2 3 4 M", "\n", "q r", *_MALFORMED]), max_size=14)


@settings(max_examples=300, deadline=None)
@given(tokens=_TOKENS, cuts=st.lists(st.integers(min_value=0, max_value=14), max_size=4))
def test_any_output_cut_anywhere_parses_as_it_does_whole_or_is_refused_the_same(tokens: list[str],
                                                                               cuts: list[int]) -> None:
    """Well formed or not: the batched parse finds what the whole parse finds, or both
    refuse the output."""
    bounds = [0, *sorted(min(c, len(tokens)) for c in cuts), len(tokens)]
    batches = [tokens[a:b] for a, b in zip(bounds, bounds[1:])]
    try:
        whole: list[tuple[str, ...]] | None = base_module.raw_changes(tokens, "", tuple)
    except ValueError:
        whole = None
    try:
        batched: list[tuple[str, ...]] | None = base_module.raw_changes_batched(batches, "", tuple)
    except ValueError:
        batched = None
    assert batched == whole


@pytest.mark.parametrize("meta", _MALFORMED)
def test_a_meta_of_any_other_shape_is_refused_not_read_off_by_a_field(meta: str) -> None:
    """Checked meta by meta: a malformed one among good ones is refused however the run's
    totals come out (a four-field and a six-field meta add up to two good ones)."""
    for tokens in (["\n" + _META, "a", meta, "b", ""], ["\n" + meta, "a", _META, "b", ""],
                   ["\n" + _MALFORMED[0], "a", _MALFORMED[1], "b", ""]):
        with pytest.raises(ValueError, match="unexpected raw diff output"):
            base_module.raw_changes(tokens, "", tuple)


def test_a_streamed_git_that_fails_says_why_and_one_left_early_is_stopped(repo: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    handle = git.discover(repo).repo()
    with pytest.raises(GitError, match=r"git log -z no-such-rev -- failed \(exit 128\): fatal: .*'no-such-rev'"):
        list(core.run_z(["log", "-z", "no-such-rev", "--"], handle))
    with pytest.raises(UntrustedRepoError):
        list(core.run_z(["log", "-z"], handle.distrust("the test says so")))
    # A reader that stops after the first batch: git is killed and reaped, not left writing.
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(core, "_BATCH", 16)
    monkeypatch.setattr(subprocess, "Popen", popen)
    batches = core.run_z(["log", "-z", "--raw", "--format=%x00commit %H", "HEAD"], handle)
    assert next(batches)
    batches.close()
    assert len(started) == 1 and started[0].returncode is not None
    assert started[0].stdout is not None and started[0].stdout.closed
    # A parse that fails stops git at once, even while its exception (and with it the
    # reading frame) is still held, as a caller reporting it does.
    for name in ("a", "b", "c"):
        (repo / name).write_text("x\n")
        gitcmd(repo, "add", name)
        gitcmd(repo, "commit", "-q", "-m", name)

    def broken(*args: Any) -> Any:
        raise ValueError("the parse failed")

    monkeypatch.setattr(base_module, "_entries", broken)
    with pytest.raises(ValueError) as failed:
        git.commit_changes(handle, "HEAD~3", "HEAD")
    log = started[-1]
    assert "--raw" in str(log.args) and log.returncode is not None and failed.value.__traceback__ is not None


def test_a_new_config_file_written_directly_reads_back_through_git_as_written(tmp_path: Path) -> None:
    """config.worktree of a new task is written without git: every value, however spelled,
    reads back through git's own parser as it was given; a file that exists already, a key
    with a subsection, or a control character is left to git (nothing written)."""
    values = {"user.name": 'Zoë "Q" O\'Neil \\ # ; ', "user.email": " lead@space.example\t",
              "core.hooksPath": "/path with spaces/[x]\nsecond line", "core.excludesFile": "="}
    admin = tmp_path / "admin"
    admin.mkdir()
    path = admin / "config.worktree"
    assert git.config_file_create(path, list(values.items()))
    assert dict(git.config_entries(path)) == {key.lower(): value for key, value in values.items()}
    # The snapshots' parse of these bytes, known without git, is what git lists for them.
    assert configfile.entries(path.read_bytes()) == git.config_entries(path)
    mask = os.umask(0o022)
    os.umask(mask)
    assert (path.stat().st_mode & 0o777) == 0o666 & ~mask and os.listdir(admin) == ["config.worktree"]
    before = path.read_bytes()
    assert not git.config_file_create(path, [("user.name", "other")]) and path.read_bytes() == before
    for pairs in ([("includeIf.gitdir:/x/.path", "/y")], [("user.name", "bell\a")], [("user name", "x")]):
        fresh = tmp_path / "fresh"
        assert not git.config_file_create(fresh, pairs) and not os.path.lexists(fresh)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target")
    assert not git.config_file_create(link, [("user.name", "x")]) and not (tmp_path / "target").exists()


def test_a_taken_branch_name_is_found_in_the_files_as_git_finds_it(repo: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Loose, packed, absent, a prefix of a packed name, a broken loose file: the answer
    comes from the files, with no git process."""
    gitcmd(repo, "branch", "ccm/packed")
    gitcmd(repo, "pack-refs", "--all")
    gitcmd(repo, "branch", "ccm/loose")
    (repo / ".git/refs/heads/ccm/broken").write_text("not an id\n")
    (repo / ".git/refs/heads/ccm/planted/deeper").mkdir(parents=True)  # empty: git removes it in its way
    (repo / ".git/refs/heads/ccm/parent").mkdir()
    (repo / ".git/refs/heads/ccm/parent/child").write_text("0" * 40 + "\n")  # ccm/parent/child: a conflict
    host = git.Repo(repo / ".git", repo / ".git", repo)
    from ccm_guard.git import refs

    monkeypatch.setattr(refs, "run", lambda *a, **k: pytest.fail(f"git was run: {a}"))
    found = {name: git.branch_taken(host, name) for name in ("ccm/packed", "ccm/loose", "ccm/broken", "ccm/pack",
                                                             "ccm/none", "main", "ccm/planted", "ccm/parent")}
    assert found == {"ccm/packed": True, "ccm/loose": True, "ccm/broken": True, "ccm/pack": False,
                     "ccm/none": False, "main": True, "ccm/planted": False, "ccm/parent": True}
    monkeypatch.undo()
    gitcmd(repo, "branch", "ccm/planted")  # and git takes the name, as branch_taken says it will


def test_a_loose_branch_is_deleted_from_the_files_as_git_deletes_it(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every exec deletes its task's branch: a plain loose ref goes without a git process,
    its reflog and emptied directories below refs/heads/ too, and leaves what git's own
    `update-ref -d` leaves (held against a twin deleted by git)."""
    from ccm_guard.git import refs

    head = gitcmd(repo, "rev-parse", "HEAD")
    for name in ("ccm/t1", "ccm/t2", "one/deep/t3", "one/deep/t4", "two/deep/t3", "two/deep/t4"):
        gitcmd(repo, "branch", name)
    host = git.Repo(repo / ".git", repo / ".git", repo)
    monkeypatch.setattr(refs, "run", lambda *a, **k: pytest.fail(f"git was run: {a}"))
    for name in ("ccm/t1", "one/deep/t3", "one/deep/t4"):
        git.delete_ref(host, f"refs/heads/{name}", head)
    monkeypatch.undo()
    for name in ("two/deep/t3", "two/deep/t4"):
        gitcmd(repo, "update-ref", "-d", f"refs/heads/{name}", head)
    assert gitcmd(repo, "for-each-ref", "--format=%(refname)") == "refs/heads/ccm/t2\nrefs/heads/main"
    common = repo / ".git"
    assert not (common / "logs/refs/heads/ccm/t1").exists() and (common / "logs/refs/heads/ccm/t2").exists()
    for top in ("refs/heads", "logs/refs/heads"):  # emptied directories go as git's go; refs/heads/ stays
        assert sorted(p.name for p in (common / top).iterdir()) == ["ccm", "main"]
    assert not list(common.rglob("*.lock"))
    assert subprocess.run(["git", "fsck", "--no-dangling"], cwd=repo, capture_output=True).returncode == 0


def test_a_branch_deletion_git_must_do_is_left_to_git(repo: Path) -> None:
    """A ref that moved is refused (compare-and-swap) with git's words; one that is packed,
    or held by another git's lock, or while refs are being packed, is git's to delete."""
    head = gitcmd(repo, "rev-parse", "HEAD")
    host = git.Repo(repo / ".git", repo / ".git", repo)
    gitcmd(repo, "commit", "-q", "--allow-empty", "-m", "next")
    gitcmd(repo, "branch", "ccm/moved")
    with pytest.raises(GitError):
        git.delete_ref(host, "refs/heads/ccm/moved", head)
    assert gitcmd(repo, "rev-parse", "ccm/moved") != head
    gitcmd(repo, "branch", "ccm/packed", head)
    gitcmd(repo, "pack-refs", "--all")
    gitcmd(repo, "branch", "-f", "ccm/packed", head)  # loose again, and in packed-refs too
    git.delete_ref(host, "refs/heads/ccm/packed", head)
    assert gitcmd(repo, "rev-parse", "--verify", "--quiet", "ccm/packed", check=False) == ""
    gitcmd(repo, "branch", "ccm/locked", head)
    (repo / ".git/refs/heads/ccm/locked.lock").write_text("")
    with pytest.raises(GitError):  # git's own "Unable to create ... .lock: File exists"
        git.delete_ref(host, "refs/heads/ccm/locked", head)
    assert gitcmd(repo, "rev-parse", "ccm/locked") == head
    (repo / ".git/refs/heads/ccm/locked.lock").unlink()
    (repo / ".git/packed-refs.lock").write_text("")  # a pack-refs at work: git waits for it, then refuses
    with pytest.raises(GitError):
        git.delete_ref(host, "refs/heads/ccm/locked", head)
    (repo / ".git/packed-refs.lock").unlink()
    git.delete_ref(host, "refs/heads/ccm/locked", head)
    git.delete_ref(host, "refs/heads/ccm/gone", head, missing_ok=True)
    gitcmd(repo, "branch", "ccm/odd", head)  # its reflog made a directory, as an agent can (git copes)
    (repo / ".git/logs/refs/heads/ccm/odd").unlink()
    (repo / ".git/logs/refs/heads/ccm/odd").mkdir()
    git.delete_ref(host, "refs/heads/ccm/odd", head)
    assert gitcmd(repo, "rev-parse", "--verify", "--quiet", "ccm/odd", check=False) == ""
    assert gitcmd(repo, "branch", "--list", "ccm/*").split() == ["ccm/moved"]


def test_a_new_config_file_is_left_to_git_where_it_cannot_be_linked_and_keeps_the_umask(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system without hard links (vfat, some FUSE mounts) refuses link(): nothing is
    left behind and git writes the file; the file's mode is git's, the umask applied."""
    from ccm_guard.prevent.hookconfig import config_edit

    admin = tmp_path / "admin"
    admin.mkdir()
    old_mask = os.umask(0o077)
    try:
        assert git.config_file_create(admin / "a", [("user.name", "A")])
        assert (admin / "a").stat().st_mode & 0o777 == 0o600

        def no_links(src: object, dst: object) -> None:
            raise PermissionError(1, "Operation not permitted")

        monkeypatch.setattr(os, "link", no_links)
        assert not git.config_file_create(admin / "b", [("user.name", "B")]) and sorted(os.listdir(admin)) == ["a"]
        config_edit(admin / "config.worktree", "core.hooksPath", "/x", also=[("user.name", "C")])
    finally:
        os.umask(old_mask)
    assert git.config_entries(admin / "config.worktree") == [("core.hookspath", "/x"), ("user.name", "C")]


def test_a_config_git_cannot_parse_is_named_in_the_error_not_a_temp_file(tmp_path: Path) -> None:
    from ccm_guard.prevent.hookconfig import config_get

    broken = tmp_path / "config"
    broken.write_text("[core]\n\thooksPath = /x\n[unclosed\n")
    with pytest.raises(GitError, match=str(broken)):
        config_get(broken, "core.hooksPath")


@pytest.mark.parametrize("rev", ["HEAD", "HEAD~1", "main", "HEAD^{tree}", "HEAD~9", "^HEAD", "HEAD~1..HEAD",
                                 "--git-dir", "-q", "nosuch", ""])
def test_discovery_and_the_base_in_one_process_agree_with_asking_one_at_a_time(repo: Path, rev: str) -> None:
    """exec's plan asks where the repository is and which commit --base names in one git
    process; where that one cannot answer plainly it must say so (None), never a
    different answer than discover + resolve_commit give."""
    gitcmd(repo, "commit", "-q", "--allow-empty", "-m", "second")
    (repo / "sub").mkdir()
    found = git.discover_commits(repo / "sub", rev)
    slow = git.resolve_commit(git.discover(repo / "sub").repo(), rev)
    if found is None:
        assert rev in ("HEAD~9", "^HEAD", "HEAD~1..HEAD", "--git-dir", "-q", "nosuch", "", "HEAD^{tree}")
    else:
        assert found == (git.discover(repo / "sub"), [slow]) and slow is not None
    # Two at once (check-paths' and verify's BASE..HEAD): both answered, or None.
    pair = git.discover_commits(repo / "sub", "HEAD~1", rev)
    assert pair == (None if found is None else (git.discover(repo / "sub"), [git.resolve_commit(
        git.discover(repo / "sub").repo(), "HEAD~1"), slow]))


def test_discovery_with_a_base_leaves_an_unborn_or_bare_repository_to_the_slow_path(tmp_path: Path) -> None:
    gitcmd(tmp_path, "init", "-q", "unborn")
    gitcmd(tmp_path, "init", "-q", "--bare", "bare.git")
    assert git.discover_commits(tmp_path / "unborn", "HEAD") is None
    assert git.discover_commits(tmp_path / "bare.git", "HEAD") is None
    assert git.discover_commits(tmp_path / "nowhere", "HEAD") is None


@pytest.mark.parametrize("name", ["a\u2028b", "a\x0cb", "a\rb", "a\x1cb"])
def test_a_repository_whose_path_holds_a_line_separator_other_than_newline_is_found_where_it_is(
        tmp_path: Path, name: str) -> None:
    """str.splitlines splits at these too: discovery must split git's answer at newlines only."""
    top = tmp_path / name / "repo"
    top.mkdir(parents=True)
    gitcmd(top, "init", "-q")
    gitcmd(top, "commit", "-q", "--allow-empty", "-m", "one")
    found = git.discover(top)
    assert found.toplevel == top.resolve() and found.git_dir == (top / ".git").resolve()
    fast = git.discover_commits(top, "HEAD")
    assert fast is not None and fast[0] == found


def test_a_repository_whose_path_holds_a_newline_is_refused_by_name(tmp_path: Path) -> None:
    top = tmp_path / "a\nb"
    top.mkdir()
    gitcmd(top, "init", "-q")
    with pytest.raises(RepoError, match="line break"):
        git.discover(top)
    assert git.discover_commits(top, "HEAD") is None


def test_a_ref_whose_name_holds_a_unicode_line_separator_is_read_whole(repo: Path) -> None:
    """git allows U+2028 and U+0085 in ref names; gc's listing of refs must not split there."""
    gitcmd(repo, "branch", "odd\u2028name")
    gitcmd(repo, "branch", "odd\u0085too")
    host = git.discover(repo).repo()
    assert {"refs/heads/odd\u2028name", "refs/heads/odd\u0085too"} <= set(git.refs_under(host, "refs/heads/"))
    assert {"refs/heads/odd\u2028name", "refs/heads/odd\u0085too"} <= {t.ref for t in git.ref_trees(host)}


_PLAIN_CONFIGS = [
    b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n\tlogallrefupdates = true\n"
    b"[remote \"origin\"]\n\turl = git@example.com:a/b.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n"
    b"[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n[extensions]\n\tworktreeConfig = true\n",
    b"# a comment\n; another\n[User]\n  Name = A  B\n  email=a@b\n[core]\n  hooksPath=/x\n  quiet\n  empty =\n",
    b"[include]\n\tpath = ~/other\n[includeIf \"gitdir:~/w/\"]\n\tpath = w.cfg\n[remote \"my origin\"]\n\turl = x\n",
    b"[core]\n\tautocrlf = input   \n\n\n[alias]\n\tst = status -sb\n\tlg = log --graph\n",  # no newline at the end:
    b"[core]\n\teditor = vim",
    b"",
]
# Fragments a spelling is made of: plain ones, and odd ones (git refuses some; quoting,
# escapes, comments, continuations, legacy dotted sections, tabs, CRs are its own to read).
_PLAIN = ["[core]", "[Core]", '[remote "o"]', '[remote "O x"]', "x = 1", "X=2", "  y", "z =", "z = a  b", "z=é",
          "x-y = 3", "# c \"", "; c", "", "   ", "\t", "x = [y]", "[a-b]", "[0]", "[-]", "\tk = v \t"]
_ODD = ["[a.b]", "[a.B]", "[ core]", "[core] x = 1", '[r "a\\"b"]', '[r ""]', "[r  \"a\"]", "z = a\tb", "z = \"q\"",
        "z = a # c", "z = a ; c", "z = a\\", "z = \\t", "1x = 2", "x_y = 4", "=v", "x = a\r", "[a_b]", "x = \x01"]


def test_plain_config_is_read_without_git_exactly_as_git_reads_it(tmp_path: Path) -> None:
    """The spelling tools write is parsed in process; whatever it accepts reads exactly as
    `git config --list` reads it, and everything else is left to git."""
    import random

    rnd = random.Random(7)
    corpus = list(_PLAIN_CONFIGS)
    for _ in range(150):
        lines = [rnd.choice(_ODD if rnd.random() < 0.1 else _PLAIN) for _ in range(rnd.randint(1, 6))]
        corpus.append(("\n".join(lines) + rnd.choice(["", "\n"])).encode())
    path = tmp_path / "config"
    parsed_plainly = 0
    for data in corpus:
        plain = configfile._parse_plain(data)
        if plain is None:
            continue
        parsed_plainly += 1
        path.write_bytes(data)
        assert plain == git.config_entries(path), data
    assert all(configfile._parse_plain(data) is not None for data in _PLAIN_CONFIGS)
    # An agent writes some of these files: a long run of blanks before a refused byte is
    # refused (a pattern that backtracked over it took seconds: this suite's time would show it).
    assert configfile._parse_plain(b"[a]\ninclude = a" + b" " * 32000 + b"\x01\n") is None
    assert 20 < parsed_plainly < len(corpus)  # the corpus exercises both sides


@pytest.mark.parametrize("name", ["sha1", "sha256"])
def test_digests_taken_without_openssl_are_hashlibs(name: str) -> None:
    """Small inputs go to the interpreter's own SHA code, large ones to OpenSSL (and those past
    a page once OpenSSL is loaded, as it is here): the same digests."""
    from ccm_guard import digest

    assert "hashlib" in sys.modules
    assert type(digest.hasher(name, digest.TINY + 1)) is type(hashlib.new(name))
    assert type(digest.hasher(name, digest.TINY)) is not type(hashlib.new(name))
    for size in (0, 300, digest.TINY, digest.TINY + 1, digest.SMALL, digest.SMALL + 1):
        data = os.urandom(size)
        h = digest.hasher(name, size)
        h.update(data)
        assert h.hexdigest() == hashlib.new(name, data).hexdigest()
    assert digest.sha256_hex(b"abc") == hashlib.sha256(b"abc").hexdigest()


def _forge_entry(repo: Path, path: str, blob: str) -> None:
    """Put `blob` back into the index entry of `path`, keeping the entry's stat data."""
    _patch_entry(repo / ".git" / "index", path, blob=bytes.fromhex(blob))


def _patch_entry(index: Path, path: str, *, blob: bytes | None = None, ctime_ns: int | None = None) -> None:
    """Rewrite one entry of a (version 2) index file: its object id, or its change time."""
    import struct

    data = bytearray(index.read_bytes())
    count, offset = struct.unpack(">I", data[8:12])[0], 12
    for _ in range(count):
        length = struct.unpack(">H", data[offset + 60:offset + 62])[0] & 0xFFF
        if bytes(data[offset + 62:offset + 62 + length]) == path.encode():
            if blob is not None:
                data[offset + 40:offset + 60] = blob
            if ctime_ns is not None:
                data[offset:offset + 8] = struct.pack(">II", ctime_ns // 10**9, ctime_ns % 10**9)
        offset += (62 + length + 8) & ~7
    body = bytes(data[:-20])
    index.write_bytes(body + hashlib.sha1(body).digest())


@pytest.mark.parametrize("trusted", ["kept", "tampered", "none"])
def test_status_reads_what_a_forged_index_entry_hides(tmp_path: Path, trusted: str) -> None:
    """Whether from ccm-guard's own copy of the index or (without one, or with one changed
    since it was kept) from HEAD's tree alone, the edit is seen; so is what the agent's index
    stages over HEAD while the file is put back."""
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"a.txt": "one\n", "b.txt": "two\n", "c.txt": "six\n"})
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    logs = tmp_path / "logs"
    logs.mkdir()
    record = keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=True)
    assert record is not None
    if trusted == "tampered":
        Path(record["path"]).write_bytes(Path(record["path"]).read_bytes())  # same bytes, a write all the same
    copy = kept_index(record if trusted != "none" else None)
    assert (copy is not None) == (trusted == "kept")
    (repo / "c.txt").write_text("new\n")  # committed work: fine
    gitcmd(repo, "commit", "-q", "-am", "work")
    old = gitcmd(repo, "rev-parse", "HEAD:a.txt").strip()
    (repo / "a.txt").write_text("EVL\n")  # as long as "one": only the stat data tells
    gitcmd(repo, "add", "a.txt")
    (repo / "b.txt").write_text("2\n")
    gitcmd(repo, "add", "b.txt")
    (repo / "b.txt").write_text("two\n")  # staged, then put back on disk
    _forge_entry(repo, "a.txt", old)
    os.utime(repo / ".git" / "index", (time.time() + 5, time.time() + 5))  # not racily clean
    r = git.Repo(repo / ".git", repo / ".git", repo)
    assert not [e for e in git.status(r) if e.path == "a.txt"]  # git's own status is fooled
    entries = {e.path: e.code for e in git.status_without_trusting_index(r, copy, ignored=True)}
    assert entries == {"a.txt": ".M", "b.txt": "M."}, entries
    from ccm_guard.git.checkout import private_index

    index = tmp_path / "private-index"
    assert private_index(r, copy, {"GIT_INDEX_FILE": str(index)}) == (trusted == "kept")


def test_status_reads_what_a_forged_index_entry_hides_with_no_commit_made(tmp_path: Path) -> None:
    """HEAD still at the base: ccm-guard's copy is HEAD's index already (no merge), and the
    edit is seen all the same."""
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"a.txt": "one\n"})
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    logs = tmp_path / "logs"
    logs.mkdir()
    copy = kept_index(keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=True))
    (repo / "a.txt").write_text("BAD\n")
    gitcmd(repo, "add", "a.txt")
    _forge_entry(repo, "a.txt", gitcmd(repo, "rev-parse", "HEAD:a.txt").strip())
    os.utime(repo / ".git" / "index", (time.time() + 5, time.time() + 5))
    r = git.Repo(repo / ".git", repo / ".git", repo)
    assert not git.status(r)
    assert [(e.path, e.code) for e in git.status_without_trusting_index(r, copy, ignored=True, head=base)] == [
        ("a.txt", ".M")]


def test_an_edit_in_the_same_second_as_the_kept_index_is_read(tmp_path: Path) -> None:
    """git reads an entry as new as its index file whatever its stat data says (a file can
    change again within the second git recorded): ccm-guard's copies keep the index's
    mtime, so an edit of the same size, its mtime put back, made in the second the index
    was written, is still seen."""
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"a.py": "print(1)\n"})
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    past = time.time_ns() - 10**10  # ten seconds ago: the private copies are written well after it
    os.utime(repo / "a.py", ns=(past, past))
    gitcmd(repo, "update-index", "--refresh")
    st = os.stat(repo / "a.py")
    os.utime(repo / ".git" / "index", ns=(past, past))  # written in the file's own second
    logs = tmp_path / "logs"
    logs.mkdir()
    copy = kept_index(keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=True))
    assert copy is not None
    (repo / "a.py").write_text("print(2)\n")
    os.utime(repo / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns))
    # Same second: as git compares them, the entry's change time is the file's new one.
    _patch_entry(copy.path, "a.py", ctime_ns=os.stat(repo / "a.py").st_ctime_ns)
    os.utime(copy.path, ns=(st.st_mtime_ns, st.st_mtime_ns))
    r = git.Repo(repo / ".git", repo / ".git", repo)
    assert [(e.path, e.code) for e in git.status_without_trusting_index(r, copy, ignored=True, head=base)] == [
        ("a.py", ".M")]


def test_a_sparse_tasks_skipped_files_are_not_taken_for_deleted(tmp_path: Path) -> None:
    """Without ccm-guard's copy (a resumed task) the private index is HEAD's tree, which
    knows nothing of the cone: files outside the recorded cone, absent by design, are no
    change; one written on disk is; and a file inside it that the agent deleted and marked
    skip-worktree in its own index is a deletion all the same."""
    from ccm_guard.worktree.sparse import in_cone

    repo = make_repo(tmp_path / "r", {"src/a.py": "a\n", "src/k.py": "k\n", "docs/b.md": "b\n",
                                      "docs/c.md": "c\n"})
    gitcmd(repo, "sparse-checkout", "set", "--cone", "src")
    assert not (repo / "docs").exists()
    r = git.Repo(repo / ".git", repo / ".git", repo)

    def status() -> dict[str, str]:
        found = git.status_without_trusting_index(r, None, ignored=True, absent_by_design=lambda p: not in_cone(p, ["src"]))
        return {e.path: e.code for e in found}

    assert status() == {}
    (repo / "docs").mkdir()
    (repo / "docs" / "b.md").write_text("changed\n")
    (repo / "src" / "k.py").unlink()
    gitcmd(repo, "update-index", "--skip-worktree", "src/k.py")
    found = status()
    assert found.get("docs/b.md", "").endswith("M") and "docs/c.md" not in found, found
    assert found.get("src/k.py") == ".D", found


@pytest.mark.parametrize("cone, path, inside", [
    (["src"], "README.md", True), (["src"], "src/a/b.py", True), (["src"], "docs/b.md", False),
    (["src/app"], "src/x.py", True), (["src/app"], "src/lib/x.py", False), (["src/app"], "srcx/y.py", False),
])
def test_in_cone_is_what_cone_mode_checks_out(cone: list[str], path: str, inside: bool) -> None:
    """The same answer as the forbid rules a sparse role gets for the cone (its twin, as
    path rules): the two must not drift apart."""
    from ccm_guard.pathrules.rules import Rules
    from ccm_guard.worktree.sparse import cone_forbid, in_cone

    assert in_cone(path, cone) is inside
    assert (Rules(None, cone_forbid(cone)).violation(path) is None) is inside


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_an_edit_to_a_file_a_setup_step_flagged_is_read(tmp_path: Path, flag: str) -> None:
    """A setup step may flag a file (a local config it edits): ccm-guard's copy of the index
    then carries the flag, which must not hide the agent's edit of that file."""
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"a.py": "one\n", "b.py": "two\n"})
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    gitcmd(repo, "update-index", flag, "a.py")  # the setup step
    logs = tmp_path / "logs"
    logs.mkdir()
    copy = kept_index(keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=False))
    (repo / "a.py").write_text("EVL\n")
    r = git.Repo(repo / ".git", repo / ".git", repo)
    for head in (base, "moved"):
        if head == "moved":
            (repo / "b.py").write_text("2\n")
            gitcmd(repo, "commit", "-q", "-m", "b", "--", "b.py")
            head = gitcmd(repo, "rev-parse", "HEAD").strip()
        found = {e.path: e.code for e in git.status_without_trusting_index(r, copy, ignored=True, head=head)}
        assert found == {"a.py": ".M"}, (head, found)


def test_what_a_setup_step_staged_and_the_agent_reset_is_no_change(tmp_path: Path) -> None:
    """Setup staged a new file and a change; the agent ran `git reset --hard`: the work tree
    is HEAD's, and HEAD has not moved."""
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"t.py": "t\n"})
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    (repo / "s.txt").write_text("s\n")
    (repo / "t.py").write_text("changed\n")
    gitcmd(repo, "add", "s.txt", "t.py")  # the setup step
    logs = tmp_path / "logs"
    logs.mkdir()
    copy = kept_index(keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=False))
    gitcmd(repo, "reset", "-q", "--hard")
    (repo / "s.txt").unlink(missing_ok=True)
    r = git.Repo(repo / ".git", repo / ".git", repo)
    assert git.status_without_trusting_index(r, copy, ignored=True, head=base) == []


def test_a_sha256_repositorys_packs_verify(tmp_path: Path) -> None:
    """git verify-pack outside a repository takes SHA-1: a SHA-256 repository's honest pack
    was taken for forged (and any run that made one failed git-metadata)."""
    repo = tmp_path / "r"
    gitcmd(tmp_path, "init", "-q", "--object-format=sha256", str(repo))
    (repo / "a.txt").write_text("a\n")
    gitcmd(repo, "add", "a.txt")
    gitcmd(repo, "commit", "-q", "-m", "a")
    gitcmd(repo, "repack", "-adq")
    assert configfile.object_format(repo / ".git") == "sha256"
    idx = next((repo / ".git" / "objects" / "pack").glob("*.idx"))
    assert git.verify_pack(idx, "sha256")
    assert not git.verify_pack(idx)  # as it was asked before
    assert configfile.object_format(tmp_path) == "sha1"  # no config: git's default


def test_an_untouched_pristine_index_stages_nothing_without_asking(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the agent's index holds the bytes ccm-guard checked out at HEAD, and HEAD has
    not moved, nothing is staged: no `diff-index --cached` runs. Where it was touched, what
    it stages is listed."""
    from ccm_guard.git import checkout
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"a.txt": "one\n"})
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    logs = tmp_path / "logs"
    logs.mkdir()
    copy = kept_index(keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=True))
    r = git.Repo(repo / ".git", repo / ".git", repo)
    asked: list[int] = []
    real = checkout.staged_changes

    def counted(repo: git.Repo) -> list[git.StatusEntry]:
        asked.append(1)
        return real(repo)

    monkeypatch.setattr(checkout, "staged_changes", counted)
    assert git.status_without_trusting_index(r, copy, ignored=True, head=base, index_untouched=True) == []
    assert asked == []
    (repo / "b.txt").write_text("staged\n")
    gitcmd(repo, "add", "b.txt")
    (repo / "b.txt").unlink()
    found = git.status_without_trusting_index(r, copy, ignored=True, head=base, index_untouched=False)
    assert asked == [1] and ("b.txt", "A.") in [(e.path, e.code) for e in found]


def test_the_kept_index_of_a_split_index_repository_is_whole(tmp_path: Path) -> None:
    """With core.splitIndex the index links to a shared index in the git dir, which the
    agent can rewrite: ccm-guard's copy is made whole, so it means the same without it."""
    from ccm_guard.run.exec import keep_index, kept_index

    repo = make_repo(tmp_path / "r", {"a.txt": "one\n", "b.txt": "two\n"})
    gitcmd(repo, "config", "core.splitIndex", "true")
    gitcmd(repo, "update-index", "--split-index")
    assert list((repo / ".git").glob("sharedindex.*"))
    base = gitcmd(repo, "rev-parse", "HEAD").strip()
    logs = tmp_path / "logs"
    logs.mkdir()
    before = os.lstat(repo / ".git" / "index").st_mtime_ns
    copy = kept_index(keep_index(Pins(repo, repo / ".git", repo / ".git", "main"), logs, at=base, pristine=True))
    assert copy is not None and os.lstat(copy.path).st_mtime_ns == before  # git's racy check still works
    for shared in (repo / ".git").glob("sharedindex.*"):
        shared.unlink()
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=repo, capture_output=True, text=True,
                            env={**os.environ, "GIT_INDEX_FILE": str(copy.path)})
    assert listed.returncode == 0 and "a.txt" in listed.stdout and "b.txt" in listed.stdout, listed.stderr


def test_a_branch_tip_and_the_current_branch_are_read_from_the_files_as_git_reads_them(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """task apply reads the task's branch, the target and the checkout's HEAD with no git
    process where the files say it plainly, and agrees with git; git answers the rest."""
    from ccm_guard.git import refs

    head = gitcmd(repo, "rev-parse", "HEAD")
    gitcmd(repo, "branch", "packed")
    gitcmd(repo, "pack-refs", "--all")
    gitcmd(repo, "commit", "-q", "--allow-empty", "-m", "two")
    gitcmd(repo, "branch", "loose")
    two = gitcmd(repo, "rev-parse", "HEAD")
    host = git.Repo(repo / ".git", repo / ".git", repo)
    monkeypatch.setattr(refs, "run", lambda *a, **k: pytest.fail(f"git was run: {a}"))
    assert {name: git.branch_tip(host, f"refs/heads/{name}") for name in ("packed", "loose", "main", "none")} == \
        {"packed": head, "loose": two, "main": two, "none": None}
    assert git.current_branch(host) == "refs/heads/main"
    monkeypatch.undo()
    gitcmd(repo, "symbolic-ref", "refs/heads/alias", "refs/heads/loose")  # symbolic: git peels it
    assert git.branch_tip(host, "refs/heads/alias") == two
    gitcmd(repo, "checkout", "-q", "--detach")
    assert git.current_branch(host) is None
