"""Class 13: the agent makes git read its stores differently from the snapshot.

Git reads an object by its id from wherever it finds it, and resolves a ref from loose
files and `packed-refs` by rules of its own. An agent that adds a store entry claiming
an existing id (or a second record for an existing ref) changes what everybody reads
without touching a file the snapshot had. The shared git dir is writable even under
Landlock (the task commits there), so each attack runs with and without the sandbox.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from adv import COMMIT, SANDBOXES, all_paths, plain_git
from conftest import ccm, git, run_exec, spawn_exec, write_agent

# Python one-liners the attacking agent runs (it has python3 like any agent's machine).
FORGE_LOOSE = """python3 - "$oid" "$objects" <<'PY'
import os, sys, zlib
oid, objects = sys.argv[1], sys.argv[2]
os.makedirs(f"{objects}/{oid[:2]}", exist_ok=True)
with open(f"{objects}/{oid[:2]}/{oid[2:]}", "wb") as fh:
    fh.write(zlib.compress(b"blob 14\\0print('evil')\\n"))
PY"""

# A one-object pack of the agent's blob, whose index then claims the existing id.
FORGE_PACK = """blob=$(printf "print('evil')\\n" | git hash-object -w --stdin)
name=$(echo "$blob" | git pack-objects -q "$objects/pack/tmp_")
python3 - "$oid" "$objects/pack/tmp_-$name.idx" <<'PY'
import hashlib, sys
oid, idx = bytes.fromhex(sys.argv[1]), sys.argv[2]
data = bytearray(open(idx, "rb").read())
fanout = [0 if i < oid[0] else 1 for i in range(256)]
data[8:8 + 1024] = b"".join(n.to_bytes(4, "big") for n in fanout)
data[8 + 1024:8 + 1024 + 20] = oid
data[-20:] = hashlib.sha1(bytes(data[:-20])).digest()
open(idx, "wb").write(bytes(data))
PY
rm -f "$objects/$(echo "$blob" | cut -c1-2)/$(echo "$blob" | cut -c3-)\""""


# A bitmap for the person's existing pack that says the tip reaches only its own commit,
# tree and blobs: git trusts it, so a push, a clone or a bundle of the repository leaves
# the rest of history out. And a .keep beside it, which pins the pack for every gc.
FORGE_BITMAP = """pack=$(ls "$objects"/pack/pack-*.idx | head -n 1)
python3 - "$pack" <<'PY'
import hashlib, struct, subprocess, sys
idx = sys.argv[1]
base = idx[:-4]
run = lambda *a: subprocess.check_output(["git", *a], text=True)
rows = [r.split() for r in run("verify-pack", "-v", idx).splitlines()]
objs = sorted((int(r[4]), r[0], r[1]) for r in rows if len(r) >= 5 and len(r[0]) == 40)
pos = {o: i for i, (_, o, _) in enumerate(objs)}
n = len(objs)
def ewah(bits):
    words = [0] * ((n + 63) // 64)
    for b in bits:
        words[b // 64] |= 1 << (b % 64)
    return (struct.pack(">II", n, len(words) + 1) + struct.pack(">Q", len(words) << 33)
            + b"".join(struct.pack(">Q", w) for w in words) + struct.pack(">I", 0))
tip = run("rev-parse", "main").strip()
keep = {tip, run("rev-parse", "main^{tree}").strip()} | {l.split()[2] for l in run("ls-tree", "-r", "-t", "main").splitlines()}
by_name = sorted(o for _, o, _ in objs)
body = b"BITM" + struct.pack(">HHI", 1, 1, 1) + open(base + ".pack", "rb").read()[-20:]
for kind in ("commit", "tree", "blob", "tag"):
    body += ewah([pos[o] for _, o, k in objs if k == kind])
body += struct.pack(">I", by_name.index(tip)) + bytes(2) + ewah([pos[o] for o in keep])
open(base + ".bitmap", "wb").write(body + hashlib.sha1(body).digest())
open(base + ".keep", "w").write("mine")
PY"""


def _agent(tmp_path: Path, forge: str) -> Path:
    return write_agent(tmp_path, f"""{COMMIT}
oid=$(git rev-parse main:src/app.py)
objects=$(git rev-parse --git-common-dir)/objects
{forge}""")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_loose_object_claiming_an_existing_id_fails_the_run(repo: Path, tmp_path: Path, sandbox: str) -> None:
    git(repo, "gc", "-q")  # the person's objects are packed: the agent adds a loose twin
    res = run_exec(repo, _agent(tmp_path, FORGE_LOOSE), "--sandbox", sandbox)
    # Git looks in packs first, so this twin shadows nothing yet; a repack that keeps the
    # loose copy, or a later prune of the pack, would serve its bytes under that id.
    assert "mismatch" in plain_git(repo, "fsck").stderr
    assert res.code == 1
    assert "do not hold what their names say" in res.reasons("git-metadata")
    oid = git(repo, "rev-parse", "main:src/app.py")
    assert f"{oid[:2]}/{oid[2:]}" in all_paths(res, "git-metadata")


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_pack_whose_index_claims_an_existing_id_fails_the_run(repo: Path, tmp_path: Path, sandbox: str) -> None:
    # The person's objects are loose; git looks in packs first, so the forged pack wins.
    res = run_exec(repo, _agent(tmp_path, FORGE_PACK), "--sandbox", sandbox)
    assert plain_git(repo, "show", "main:src/app.py").stdout == "print('evil')\n"  # what everybody reads now
    forged = [p for p in (repo / ".git/objects/pack").glob("tmp_-*.idx")]
    assert forged and plain_git(repo, "verify-pack", str(forged[0])).returncode != 0
    assert res.code == 1
    assert "does not verify" in res.reasons("git-metadata")
    assert f"pack/{forged[0].name}" in all_paths(res, "git-metadata")


# The person's own pack index rewritten in place, its size kept and its checksum made
# good again: two objects trade places (offsets and CRCs), so that src/app.py's id reads
# README.md's bytes. The pack itself is untouched.
SWAP_IN_INDEX = """idx=$(ls "$objects"/pack/pack-*.idx | head -n 1)
chmod u+w "$idx"
python3 - "$idx" "$oid" "$(git rev-parse main:README.md)" <<'PY'
import hashlib, sys
idx, a, b = sys.argv[1], bytes.fromhex(sys.argv[2]), bytes.fromhex(sys.argv[3])
data = bytearray(open(idx, "rb").read())
n = int.from_bytes(data[8 + 255 * 4:8 + 256 * 4], "big")
names = [bytes(data[1032 + 20 * i:1052 + 20 * i]) for i in range(n)]
i, j = names.index(a), names.index(b)
for table in (1032 + 20 * n, 1032 + 24 * n):  # the CRCs, then the offsets
    x, y = table + 4 * i, table + 4 * j
    data[x:x + 4], data[y:y + 4] = data[y:y + 4], data[x:x + 4]
data[-20:] = hashlib.sha1(bytes(data[:-20])).digest()
open(idx, "r+b").write(bytes(data))
PY"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_the_persons_pack_index_rewritten_with_a_good_checksum_fails_the_run(repo: Path, tmp_path: Path,
                                                                              sandbox: str) -> None:
    """An existing object file may change only as git's freshening changes it (its times).
    An index rewritten in place with its size kept and a checksum that holds still maps
    ids to other bytes: git verifies the pack behind it, not its trailer alone."""
    git(repo, "gc", "-q")
    res = run_exec(repo, _agent(tmp_path, SWAP_IN_INDEX), "--sandbox", sandbox)
    assert plain_git(repo, "show", "main:src/app.py").stdout == "# project\n"  # the forgery works
    assert res.code == 1
    assert "existing object file(s) were rewritten" in res.reasons("git-metadata")
    idx = next((repo / ".git/objects/pack").glob("pack-*.idx"))
    assert f"pack/{idx.name}" in all_paths(res, "git-metadata")


# The person's pack and its index rewritten in place with another pair that agrees with
# itself (git verify-pack passes it) and has the same sizes, one of their objects left out:
# a padding blob is grown until the new pack is exactly as long as the old.
SWAP_PACK = r"""victim=$(git rev-parse main:src/app.py)
python3 - "$objects" "$victim" <<'PY'
import glob, os, subprocess, sys
objects, victim = sys.argv[1], sys.argv[2]
pack = glob.glob(f"{objects}/pack/pack-*.pack")[0]
idx = pack[:-5] + ".idx"
size = os.path.getsize(pack)
run = lambda *a, **k: subprocess.run(["git", *a], capture_output=True, text=True, check=True, **k).stdout
rows = [r.split() for r in run("verify-pack", "-v", idx).splitlines()]
keep = [r[0] for r in rows if len(r) >= 5 and len(r[0]) == 40 and r[0] != victim]
noise = os.urandom(4096).hex()
for n in range(1, 4000):
    pad = run("hash-object", "-w", "--stdin", input=noise[:n]).strip()
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"swap-{os.getpid()}-{n}")  # the agent's own
    name = run("pack-objects", "-q", out, input="\n".join([*keep, pad]) + "\n").strip()
    if os.path.getsize(f"{out}-{name}.pack") == size:
        break
else:
    raise SystemExit("no pack of the same size")
for src, dst in ((f"{out}-{name}.pack", pack), (f"{out}-{name}.idx", idx)):
    os.chmod(dst, 0o644)
    with open(dst, "r+b") as fh:
        fh.write(open(src, "rb").read())
        fh.truncate()
PY"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_the_persons_pack_swapped_for_one_that_agrees_with_itself_fails_the_run(repo: Path, tmp_path: Path,
                                                                                 sandbox: str) -> None:
    """git verify-pack passes any pack and index that agree with each other: a changed pack
    passes only if its bytes still hash to its name (found by a review of the fix above)."""
    git(repo, "gc", "-q")
    res = run_exec(repo, _agent(tmp_path, SWAP_PACK), "--sandbox", sandbox)
    assert plain_git(repo, "cat-file", "-e", "main:src/app.py").returncode != 0  # the person's blob is gone
    assert res.code == 1
    assert "existing object file(s) were rewritten" in res.reasons("git-metadata")
    pack = next((repo / ".git/objects/pack").glob("pack-*.pack"))
    assert {f"pack/{pack.name}", f"pack/{pack.stem}.idx"} <= set(all_paths(res, "git-metadata"))


def test_a_pack_git_freshened_passes_and_apply_checks_it_by_its_name(repo: Path, tmp_path: Path) -> None:
    """Git sets a pack's times whenever it writes an object the pack already holds (a
    commit whose tree is partly old): the run passes, and a later apply, which looks again
    at what was written since its task began, hashes the pack against its name rather
    than asking git to verify every object in it."""
    git(repo, "gc", "-q")
    assert run_exec(repo, write_agent(tmp_path, COMMIT, name="one.sh"), "--task", "f1").code == 0
    pack = next((repo / ".git/objects/pack").glob("pack-*.pack"))
    before = pack.stat()
    freshen = write_agent(tmp_path, f"{COMMIT.replace('agent work', 'more work')}\ntouch {pack}", name="two.sh")
    res = run_exec(repo, freshen, "--task", "f2", "--sandbox", "none")
    assert res.code == 0, res.reasons("git-metadata")
    assert pack.stat().st_ctime_ns > before.st_ctime_ns and pack.stat().st_ino == before.st_ino
    applied = ccm("task", "apply", "f1", "--json", cwd=repo)
    assert applied.returncode == 0, applied.stderr
    assert (repo / "work.txt").read_text() == "agent work\n"


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_bitmap_forged_for_the_persons_pack_fails_the_run(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """No existing file changes: the new .bitmap and .keep sit beside the person's pack."""
    for n in range(4):
        (repo / f"f{n}.txt").write_text(f"{n}\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"history {n}")
    git(repo, "gc", "-q")
    every = len(plain_git(repo, "rev-list", "--objects", "--all").stdout.splitlines())
    res = run_exec(repo, _agent(tmp_path, FORGE_BITMAP), "--sandbox", sandbox)
    seen = plain_git(repo, "rev-list", "--objects", "main", "--use-bitmap-index").stdout.splitlines()
    assert 0 < len(seen) < every  # the forgery works: git trusts the bitmap and leaves history out
    assert res.code == 1
    assert "beside a pack from before the run" in res.reasons("git-metadata")
    paths = all_paths(res, "git-metadata")
    assert any(p.endswith(".bitmap") for p in paths) and any(p.endswith(".keep") for p in paths)


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_a_bitmap_written_with_a_new_pack_fails_the_run(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """A new pack verifies; the bitmap beside it is never looked at (a forged one, blob bits
    cleared, leaves objects out of every push): any new bitmap fails."""
    agent = write_agent(tmp_path, f"""{COMMIT}
rgit pack-objects -q --revs --all --write-bitmap-index "$(git rev-parse --git-common-dir)/objects/pack/pack" \
    </dev/null >/dev/null""")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    assert res.code == 1 and "reachability bitmap" in res.reasons("git-metadata")
    assert any(p.endswith(".bitmap") for p in all_paths(res, "git-metadata"))


def test_honest_new_objects_and_packs_pass(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
echo more > more.txt; git add more.txt; git commit -q -m more
objects=$(git rev-parse --git-common-dir)/objects
git rev-parse HEAD | git pack-objects -q --revs "$objects/pack/pack" >/dev/null""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.code == 0, res.verdict


@pytest.mark.parametrize("sandbox", SANDBOXES)
@pytest.mark.parametrize("how", ["duplicate", "out-of-order"])
def test_a_second_packed_record_that_moves_main_fails_the_run(repo: Path, tmp_path: Path, sandbox: str,
                                                              how: str) -> None:
    git(repo, "branch", "zz")
    git(repo, "pack-refs", "--all")
    before = git(repo, "rev-parse", "main")
    # A second record for main after (or an extra one out of) git's sorted order: git's
    # binary search finds the agent's commit, a plain top-to-bottom read the person's.
    record = 'printf "%s refs/heads/main\\n" "$(git rev-parse HEAD)" >> "$packed"'
    if how == "out-of-order":
        record = ('{ head -1 "$packed"; printf "%s refs/heads/main\\n" "$(git rev-parse HEAD)"; '
                  'tail -n +2 "$packed"; } > "$packed.new" && mv "$packed.new" "$packed"')
    agent = write_agent(tmp_path, f"""{COMMIT}
packed=$(git rev-parse --git-common-dir)/packed-refs
{record}""")
    packed = (repo / ".git/packed-refs").read_bytes()
    res = run_exec(repo, agent, "--sandbox", sandbox)
    if sandbox == "landlock":  # packed-refs is not among the task's writable files: prevented
        assert (repo / ".git/packed-refs").read_bytes() == packed
        assert git(repo, "rev-parse", "main") == before
        return
    assert (repo / ".git/packed-refs").read_bytes() != packed
    assert res.code == 1
    assert "packed-refs was turned into malformed" in res.reasons("refs-untouched")


def test_ccm_guard_s_git_has_no_home_to_plant_an_ignore_file_in(repo: Path, tmp_path: Path) -> None:
    # An unsandboxed agent looks for ccm-guard's own git HOME (once a temp dir per process,
    # left behind in ccm-guard's TMPDIR) to hide a leftover from clean-tree with an ignore
    # file there. ccm-guard's git now has HOME=/dev/null, under which nothing can be made,
    # and no run leaves a temporary directory in its TMPDIR (the agent's own TMPDIR is a
    # private one, so the search below finds nothing either way; the last assertion is
    # the one that failed before).
    temp = tmp_path / "tmp"
    temp.mkdir()
    agent = write_agent(tmp_path, f"""{COMMIT}
for home in "$TMPDIR"/ccm-guard-githome-* /dev/null; do
  mkdir -p "$home/.config/git" 2>/dev/null && echo leftover.txt > "$home/.config/git/ignore"
done
echo junk > leftover.txt""")
    res = run_exec(repo, agent, "--sandbox", "none", env={"TMPDIR": str(temp)})
    assert res.code == 1
    assert "leftover.txt" in all_paths(res, "clean-tree")
    assert sorted(p.name for p in temp.iterdir()) == []


# The agent's index entry for src/app.py pairs HEAD's blob with the edited file's stat data
# (same size): git trusts the stat data and never reads the file.
FORGE_INDEX_ENTRY = """old=$(git rev-parse HEAD:src/app.py)
printf "print('EVIL')\\n" > src/app.py   # as long as the committed "print('hi')"
git add src/app.py
sleep 1.1   # not "racily clean": the index is written well after the file
python3 - "$(git rev-parse --git-path index)" "$old" <<'PY'
import hashlib, struct, sys
path, old = sys.argv[1], bytes.fromhex(sys.argv[2])
data = bytearray(open(path, "rb").read())
count, offset = struct.unpack(">I", data[8:12])[0], 12
for _ in range(count):
    length = struct.unpack(">H", data[offset + 60:offset + 62])[0] & 0xfff
    if bytes(data[offset + 62:offset + 62 + length]) == b"src/app.py":
        data[offset + 40:offset + 60] = old
    offset += (62 + length + 8) & ~7
body = bytes(data[:-20])
open(path, "wb").write(body + hashlib.sha1(body).digest())
PY"""


@pytest.mark.parametrize("sandbox", SANDBOXES)
def test_an_edit_hidden_by_a_forged_index_entry_fails_clean_tree(repo: Path, tmp_path: Path, sandbox: str) -> None:
    """Committed work, then an uncommitted edit that the agent's index hides from git status:
    the kept worktree (and a --check run in it) would hold code that is not in the commit."""
    agent = write_agent(tmp_path, f"{COMMIT}\n{FORGE_INDEX_ENTRY}")
    res = run_exec(repo, agent, "--sandbox", sandbox)
    worktree = Path(res.verdict["worktree"])
    assert "EVIL" in (worktree / "src/app.py").read_text()
    assert plain_git(worktree, "status", "--porcelain").stdout == ""  # git itself sees nothing
    assert res.code == 1
    assert "src/app.py" in all_paths(res, "clean-tree")
    assert "changed but not committed" in res.reasons("clean-tree")
    # A later audit of the kept worktree reads it the same way (from ccm-guard's own copy).
    audit = json.loads(ccm("audit", "--json", res.verdict["task"], cwd=repo).stdout)
    clean = next(g for g in audit["gates"] if g["name"] == "clean-tree")
    assert clean["status"] == "fail" and "src/app.py" in clean["findings"][0]["paths"]


# The agent's first act, in the second ccm-guard checked the files out: src/app.py rewritten
# in place with its size, its mtime put back to the nanosecond. git compares whole seconds;
# ccm-guard lets it trust a fresh checkout's entries only where proven to the nanosecond,
# and only the change time, which no one can put back, tells this file apart.
SAME_SECOND_EDIT = """python3 - <<'PY'
import os
st = os.lstat("src/app.py")
with open("src/app.py", "w") as fh:
    fh.write("print('EV')\\n")  # as long as "print('hi')"
os.utime("src/app.py", ns=(st.st_atime_ns, st.st_mtime_ns))
PY"""


@pytest.mark.parametrize("commit", [True, False])
def test_an_edit_with_its_size_and_mtime_kept_fails_clean_tree(repo: Path, tmp_path: Path, commit: bool) -> None:
    agent = write_agent(tmp_path, SAME_SECOND_EDIT + (f"\n{COMMIT.replace('git add -A', 'git add work.txt')}"
                                                      if commit else ""))
    res = run_exec(repo, agent, *(() if commit else ("--no-require-commit",)))
    assert "EV" in (Path(res.verdict["worktree"]) / "src/app.py").read_text()
    assert res.code == 1
    assert "src/app.py" in all_paths(res, "clean-tree")


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_an_edit_hidden_by_an_index_flag_fails_clean_tree(repo: Path, tmp_path: Path, flag: str) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
echo "print('edited')" > src/app.py
git update-index {flag} src/app.py""")
    res = run_exec(repo, agent)
    worktree = Path(res.verdict["worktree"])
    assert plain_git(worktree, "status", "--porcelain").stdout == ""  # git itself sees nothing
    assert res.code == 1
    assert "src/app.py" in all_paths(res, "clean-tree")
    assert "flagged assume-unchanged or skip-worktree" in res.reasons("clean-tree")


@pytest.mark.parametrize("flag", ["--assume-unchanged", "--skip-worktree"])
def test_an_edit_hidden_by_an_index_flag_in_the_persons_checkout_is_named(repo: Path, tmp_path: Path,
                                                                          flag: str) -> None:
    """Unsandboxed, the agent flags a file of the person's checkout and edits it there:
    git status no longer shows it, so the flag itself is reported."""
    agent = write_agent(tmp_path, f"""{COMMIT}
cd {repo}
rgit update-index {flag} src/app.py
echo "print('edited in your checkout')" > src/app.py""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert plain_git(repo, "status", "--porcelain").stdout == ""  # git itself sees nothing
    assert "src/app.py" in all_paths(res, "main-checkout")
    assert "flagged assume-unchanged or skip-worktree" in res.reasons("main-checkout")


@pytest.mark.parametrize("what", ["fifo", "bomb"])
def test_a_loose_object_that_would_hang_or_exhaust_the_check_is_a_forgery(repo: Path, tmp_path: Path,
                                                                         what: str) -> None:
    # A FIFO where an object file belongs (opening it would wait for ever), or a small file
    # that inflates to a gigabyte.
    make = ('mkfifo "$target"' if what == "fifo" else
            'python3 -c "import sys, zlib; c = zlib.compressobj(9); sys.stdout.buffer.write('
            'c.compress(b\'blob 10\\\\0\' + bytes(1 << 30)) + c.flush())" > "$target"')
    agent = write_agent(tmp_path, f"""{COMMIT}
objects=$(git rev-parse --git-common-dir)/objects
mkdir -p "$objects/ab"; target="$objects/ab/{'c' * 38}"
{make}""")
    res = run_exec(repo, agent, "--sandbox", "none", timeout=120)
    assert res.code == 1
    assert f"ab/{'c' * 38}" in all_paths(res, "git-metadata")


def test_reflogs_rewritten_with_the_same_lines_are_not_a_finding(repo: Path, tmp_path: Path) -> None:
    """`git reflog expire` (which gc and maintenance run) rewrites every reflog through a
    lock file: a new file, the same lines. Reflogs are compared by what they hold, so the
    person's gc during a run fails nothing; a line taken out still shows."""
    git(repo, "branch", "side")
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit -C {repo} reflog expire --all --expire=never")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "expire")
    assert res.code == 0, res.reasons("git-metadata")
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit -C {repo} reflog expire --expire=now refs/heads/side", name="cut.sh")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "cut")
    assert res.code == 1 and "reflog logs/refs/heads/side was rewritten but its ref did not move" in res.reasons("git-metadata")


def test_an_apply_while_another_agent_forged_a_pack_is_refused(repo: Path, tmp_path: Path) -> None:
    """g1 passed with its reviewed src/app.py. While g2's agent is still at work it adds a
    pack whose index claims that blob's id with other bytes: g2's own run fails only when
    it ends, and `task apply g1` would read the forged bytes into the person's checkout."""
    good = write_agent(tmp_path, """printf "print('reviewed')\\n" > src/app.py; git commit -qam reviewed""",
                       name="good.sh")
    assert run_exec(repo, good, "--task", "g1").code == 0
    gate = tmp_path / "go"  # the agent can read it under the sandbox (it can write none of this)
    forger = write_agent(tmp_path, f"""oid=$(git rev-parse ccm/g1:src/app.py)
objects=$(git rev-parse --git-common-dir)/objects
{FORGE_PACK}
mv "$objects/pack/tmp_-$name.idx" "$objects/pack/pack-$name.idx"; mv "$objects/pack/tmp_-$name.pack" "$objects/pack/pack-$name.pack"
while [ ! -e {gate} ]; do sleep 0.05; done
{COMMIT}""", name="forger.sh")
    proc = spawn_exec(repo, "--json", "--task", "g2", "--", str(forger))
    try:
        deadline = time.monotonic() + 60
        packs = repo / ".git" / "objects" / "pack"
        while not (list(packs.glob("pack-*.idx")) and list(packs.glob("pack-*.pack"))):
            assert time.monotonic() < deadline and proc.poll() is None, "the forger did not get there"
            time.sleep(0.05)
        time.sleep(0.5)  # its loose twin removed
        applied = ccm("task", "apply", "g1", cwd=repo)
    finally:
        gate.touch()
        proc.communicate(timeout=60)
    assert applied.returncode != 0 and "do not hold what their names say" in applied.stderr, applied.stderr
    assert len(applied.stderr.strip().splitlines()) == 1
    assert (repo / "src/app.py").read_text() == "print('hi')\n"  # the person's checkout as it was
    assert git(repo, "rev-parse", "main") != git(repo, "rev-parse", "ccm/g1")


def test_an_apply_checks_what_another_agent_forged_before_this_task_began(repo: Path, tmp_path: Path) -> None:
    """g2's agent rewrites the person's pack index in place and stays at work; g3 begins
    after that, passes (its baseline already holds the forgery), and is applied: the apply
    looks at what was written since the first task still at work began, not since g3 did
    (found by a review)."""
    git(repo, "gc", "-q")
    gate = tmp_path / "go"
    forger = write_agent(tmp_path, f"""oid=$(git rev-parse main:src/app.py)
objects=$(git rev-parse --git-common-dir)/objects
{SWAP_IN_INDEX}
touch {tmp_path / "forged"}
while [ ! -e {gate} ]; do sleep 0.05; done
{COMMIT}""", name="forger.sh")
    proc = spawn_exec(repo, "--json", "--sandbox", "none", "--task", "g2", "--", str(forger))
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "forged").exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the forger did not get there"
            time.sleep(0.05)
        time.sleep(1.1)  # g3 begins a clear second after the forgery
        good = write_agent(tmp_path, COMMIT, name="good.sh")
        assert run_exec(repo, good, "--task", "g3").code == 0
        applied = ccm("task", "apply", "g3", cwd=repo)
    finally:
        gate.touch()
        proc.communicate(timeout=60)
    assert applied.returncode != 0 and "do not hold what their names say" in applied.stderr, applied.stderr
    assert git(repo, "rev-parse", "main") != git(repo, "rev-parse", "ccm/g3")


def _tagged(repo: Path) -> tuple[str, str]:
    """An annotated tag v1 on the first commit, a second commit on main, all packed:
    packed-refs holds v1's peeled line. Returns (the tag's commit, main)."""
    first = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "-a", "-m", "one", "v1")
    git(repo, "commit", "-q", "--allow-empty", "-m", "two")
    git(repo, "pack-refs", "--all")
    return first, git(repo, "rev-parse", "HEAD")


@pytest.mark.parametrize("mode", ["forged", "twice"])
def test_a_forged_peeled_line_in_packed_refs_fails_the_run(repo: Path, tmp_path: Path, mode: str) -> None:
    """Without the sandbox the agent rewrites the peeled line of a packed tag: git describe
    then names v1 for main, and what this repository serves advertises it; written twice,
    git can list no ref at all. The ref itself never moved."""
    first, main = _tagged(repo)
    packed = repo / ".git" / "packed-refs"
    line = f"^{main}\\n^{main}" if mode == "twice" else f"^{main}"
    agent = write_agent(tmp_path, f"""{COMMIT}
sed -i 's/^\\^[0-9a-f]*$/{line}/' {packed}""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert f"^{main}" in packed.read_text()  # it happened
    if mode == "forged":
        assert plain_git(repo, "describe", main).stdout.strip() == "v1"  # what the person's git now says
    assert res.code != 0 and res.status("refs-untouched") == "fail", res.stdout
    assert ("which is not what it peels to" if mode == "forged" else "packed-refs") in res.reasons("refs-untouched")


def test_packing_refs_with_an_annotated_tag_is_no_finding(repo: Path, tmp_path: Path) -> None:
    """(benign) `git pack-refs --all` (here the real git's, which the guard hooks would
    stop: it rewrites other refs' records) writes a tag's peeled line: the true one passes."""
    git(repo, "tag", "-a", "-m", "one", "v1")
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit pack-refs --all")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert "refs/tags/v1^{}" in plain_git(repo, "show-ref", "-d").stdout
    assert res.code == 0 and res.status("refs-untouched") == "pass", res.stdout
