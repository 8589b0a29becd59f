"""The copied-directory strategy: `ccm-guard exec` in a directory that is in no git repository.

End to end through the real CLI (a real agent process in a real copy), then apply,
discard and restore at unit level on the tasks those runs registered. Every test looks
at the directories afterwards, not only at the verdict.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ccm, run_exec, write_agent

from ccm_guard.copy import exec as copyexec
from ccm_guard.errors import ApplyRefused, StateError
from ccm_guard.prevent import sandbox
from ccm_guard.state.registry import Registry, Task

EDIT = """
printf 'a\\nB\\nc\\nd\\n' > src/app.txt
echo new > docs/new.txt
rm old.txt
"""


def plain(tmp_path: Path, files: dict[str, str] | None = None) -> Path:
    root = tmp_path / "plain"
    for name, text in (files or {"README": "hello\n", "src/app.txt": "a\nb\nc\n", "old.txt": "gone\n"}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "docs").mkdir(exist_ok=True)
    return root


def tree(root: Path) -> dict[str, Any]:
    """Everything under root as (kind, mode, content or target), links not followed."""
    found: dict[str, Any] = {}
    for path, st in copyexec.walk(root):
        full = root / path
        if stat.S_ISLNK(st.st_mode):
            found[path] = ("l", os.readlink(full))
        elif stat.S_ISDIR(st.st_mode):
            found[path] = ("d", stat.S_IMODE(st.st_mode))
        elif stat.S_ISREG(st.st_mode):
            found[path] = ("f", stat.S_IMODE(st.st_mode), full.read_bytes())
        else:
            found[path] = ("o",)
    return found


def task_of(verdict: dict[str, Any]) -> Task:
    return Registry().get(verdict["task"])


def gates(verdict: dict[str, Any]) -> dict[str, str]:
    return {g["name"]: g["status"] for g in verdict["gates"]}


def reasons(verdict: dict[str, Any], gate: str) -> str:
    return "\n".join(f["reason"] for g in verdict["gates"] if g["name"] == gate for f in g["findings"])


def state_entries(tmp_path: Path) -> dict[str, list[str]]:
    state = tmp_path / "state"
    return {d: sorted(p.name for p in (state / d).glob("*")) if (state / d).exists() else []
            for d in ("copies", "logs", "archive")}


# --- exec ----------------------------------------------------------------------------------------


def test_a_plain_directory_runs_in_a_copy_and_the_verdict_says_so(tmp_path: Path) -> None:
    src = plain(tmp_path)
    before = tree(src)
    res = run_exec(src, write_agent(tmp_path, EDIT))

    assert res.code == 0, res.stderr
    v = res.verdict
    assert v["strategy"] == "copy" and v["branch"] == "(copy)" and v["commits"] == []
    assert "copied-directory fallback" in v["notes"][0] and str(src) in v["notes"][0]
    assert v["not_run"] == ["git-metadata", "refs-untouched", "main-checkout", "new-commit", "clean-tree"]
    assert "not run, as they need git: git-metadata" in " ".join(v["notes"])
    assert gates(v) == {"processes": "pass", "source-untouched": "pass", "path-policy": "pass",
                        "symlinks": "pass", "limits": "pass"}
    assert {f["path"]: (f["added"], f["deleted"]) for f in v["files"]} == {
        "docs/new.txt": (1, 0), "old.txt": (0, 1), "src/app.txt": (2, 1)}
    # The agent worked in the copy; the original is exactly as it was.
    assert tree(src) == before
    copy = Path(v["worktree"])
    assert copy.is_relative_to(tmp_path / "state" / "copies")
    assert (copy / "src/app.txt").read_text() == "a\nB\nc\nd\n" and not (copy / "old.txt").exists()
    t = task_of(v)
    assert t.status == "COMMITTED" and t.option("strategy") == "copy" and t.option("source") == str(src)
    assert t.base == v["base"] == copyexec.manifest_hash(copyexec.read_manifest(t)) != v["head"]
    assert json.loads(t.verdict or "{}")["strategy"] == "copy"


def test_the_agent_runs_with_a_scrubbed_environment_in_the_copy(tmp_path: Path) -> None:
    src = plain(tmp_path)
    agent = write_agent(tmp_path, 'env > "$CCM_GUARD_WORKTREE/env.txt"; pwd > here.txt')
    res = run_exec(src, agent, env={"SSH_AUTH_SOCK": "/tmp/agent.sock", "GIT_DIR": "/elsewhere"})

    copy = Path(res.verdict["worktree"])
    env = dict(line.split("=", 1) for line in (copy / "env.txt").read_text().splitlines() if "=" in line)
    assert (copy / "here.txt").read_text().strip() == str(copy)
    assert env["CCM_GUARD_STRATEGY"] == "copy" and env["CCM_GUARD_TASK"] == res.verdict["task"]
    assert "SSH_AUTH_SOCK" not in env and "GIT_DIR" not in env
    assert env["TMPDIR"].startswith(res.verdict["log_dir"])


def test_a_forbidden_path_fails_path_policy(tmp_path: Path) -> None:
    src = plain(tmp_path)
    res = run_exec(src, write_agent(tmp_path, 'echo "default_role = \\"qa\\"" > .ccm-guard.toml\necho x > ok.txt'))

    assert res.code == 1
    assert gates(res.verdict)["path-policy"] == "fail"
    assert ".ccm-guard.toml: changed, but forbidden" in reasons(res.verdict, "path-policy")
    assert task_of(res.verdict).status == "ERRORED"


def test_symlinks_that_leave_the_copy_fail(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "file").write_text("not the agent's\n")
    src = plain(tmp_path)
    os.symlink(outside, src / "ext")  # the person's own link out of the directory: not a finding
    agent = write_agent(tmp_path, "ln -s /etc/passwd leak\nln -s ext/file chained\nln -s src/app.txt inside")
    res = run_exec(src, agent)

    assert res.code == 1
    assert "leak: is a symlink pointing outside" in reasons(res.verdict, "path-policy")
    assert gates(res.verdict)["symlinks"] == "fail"
    assert reasons(res.verdict, "symlinks") == f"chained resolves outside the copy, to {outside / 'file'}"
    # As git counts a symlink: its target is one line.
    assert {f["path"]: (f["added"], f["deleted"]) for f in res.verdict["files"]}["inside"] == (1, 0)


def test_a_process_left_running_is_killed_and_fails_the_run(tmp_path: Path) -> None:
    src = plain(tmp_path)
    pid_file = tmp_path / "pid"
    agent = write_agent(tmp_path, f'setsid sleep 300 >/dev/null 2>&1 < /dev/null &\necho $! > {pid_file}')
    res = run_exec(src, agent, "--sandbox", "none")

    assert res.code == 1 and gates(res.verdict)["processes"] == "fail"
    assert "sleep 300" in " ".join(f for g in res.verdict["gates"] for x in g["findings"] for f in x["paths"])
    pid = int(pid_file.read_text())
    alive = Path(f"/proc/{pid}/stat")
    assert not alive.exists() or alive.read_text().split(") ")[1].startswith("Z")


def test_the_directory_s_own_policy_sets_the_limits(tmp_path: Path) -> None:
    src = plain(tmp_path, {"README": "hello\n", ".ccm-guard.toml": "[roles.implementor.limits]\nmax_files = 1\n"})
    res = run_exec(src, write_agent(tmp_path, "echo one > a.txt\necho two > b.txt"))

    assert res.code == 1 and gates(res.verdict)["limits"] == "fail"
    assert reasons(res.verdict, "limits") == "the run changed 2 files; the limit is 1"


def test_a_read_only_run_must_leave_the_copy_as_it_was(tmp_path: Path) -> None:
    src = plain(tmp_path)
    quiet = run_exec(src, write_agent(tmp_path, "cat README > /dev/null", name="quiet.sh"), "--read-only")
    noisy = run_exec(src, write_agent(tmp_path, "echo x >> README", name="noisy.sh"), "--read-only")

    assert quiet.code == 0 and gates(quiet.verdict)["unchanged"] == "pass"
    assert "head-frozen" in quiet.verdict["not_run"] and "new-commit" not in quiet.verdict["not_run"]
    assert noisy.code == 1 and gates(noisy.verdict)["unchanged"] == "fail"
    assert reasons(noisy.verdict, "unchanged") == "a read-only run changed 1 path(s) in its copy"


def test_an_agent_that_fails_exits_3_and_keeps_its_copy(tmp_path: Path) -> None:
    src = plain(tmp_path)
    res = run_exec(src, write_agent(tmp_path, "echo partial > part.txt\nexit 5"))

    assert res.code == 3 and res.verdict["agent"]["exit_code"] == 5
    assert (Path(res.verdict["worktree"]) / "part.txt").exists()
    assert task_of(res.verdict).status == "ERRORED"


@pytest.mark.parametrize("case", ["base", "require-commit", "state-inside", "not-found"])
def test_refusals_are_one_line_and_leave_nothing_behind(tmp_path: Path, case: str) -> None:
    src = plain(tmp_path)
    agent = str(write_agent(tmp_path, "echo x > x.txt"))
    args, env, code, words = {
        "base": (["--base", "main"], {}, 2, "--base 'main' needs a git repository"),
        "require-commit": (["--require-commit"], {}, 2, "--require-commit needs a git repository"),
        "state-inside": ([], {"CCM_GUARD_HOME": str(src / ".state")}, 5, "holds ccm-guard's state directory"),
        "not-found": ([], {}, 127, "not found"),
    }[case]
    if case == "not-found":
        agent = str(tmp_path / "no-such-agent.sh")
    proc = ccm("exec", *args, "--", agent, cwd=src, env=env)

    assert proc.returncode == code
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccm-guard: error: ") and words in lines[0], proc.stderr
    assert state_entries(tmp_path) == {"copies": [], "logs": [], "archive": []}
    assert Registry().list(live_only=False) == []
    assert not (src / ".state").exists() or not any((src / ".state").rglob("copies"))


def test_special_files_are_left_out_and_odd_names_survive(tmp_path: Path) -> None:
    src = plain(tmp_path, {"README": "hello\n"})
    os.mkfifo(src / "pipe")
    odd = os.fsencode(str(src)) + b"/caf\xe9 \nname.txt"
    with open(odd, "wb") as fh:
        fh.write(b"one\n")
    agent = write_agent(tmp_path, 'for f in caf*; do echo two >> "$f"; done')
    res = run_exec(src, agent)

    assert res.code == 0, res.stderr
    assert any("1 special file(s)" in n and "pipe" in n for n in res.verdict["notes"])
    copy = Path(res.verdict["worktree"])
    assert not os.path.lexists(copy / "pipe")
    assert [f["path"] for f in res.verdict["files"]] == [os.fsdecode(b"caf\xe9 \nname.txt")]
    applied = copyexec.apply_copy(Registry(), task_of(res.verdict))
    assert applied.modified == (os.fsdecode(b"caf\xe9 \nname.txt"),)
    with open(odd, "rb") as fh:
        assert fh.read() == b"one\ntwo\n"
    assert stat.S_ISFIFO(os.lstat(src / "pipe").st_mode)  # the person's FIFO is untouched


def test_on_fail_discard_moves_the_copy_to_the_archive(tmp_path: Path) -> None:
    src = plain(tmp_path)
    res = run_exec(src, write_agent(tmp_path, "echo work > kept.txt\nmkdir .git\necho x > .git/config"),
                   "--on-fail", "discard")

    assert res.code == 1
    archive = Path(res.verdict["archive"])
    assert archive.is_relative_to(tmp_path / "state" / "archive")
    assert (archive / "kept.txt").read_text() == "work\n"  # nothing is lost
    assert not Path(res.verdict["worktree"]).exists()
    assert task_of(res.verdict).status == "DISCARDED"


def test_exec_apply_writes_the_work_back_on_pass(tmp_path: Path) -> None:
    src = plain(tmp_path)
    res = run_exec(src, write_agent(tmp_path, EDIT), "--apply")

    assert res.code == 0, res.stderr
    applied = res.verdict["applied"]
    assert applied["strategy"] == "copy" and applied["target"] == str(src)
    assert (applied["files"], applied["insertions"], applied["deletions"]) == (3, 3, 2)
    assert (src / "src/app.txt").read_text() == "a\nB\nc\nd\n" and not (src / "old.txt").exists()
    assert tree(src) == tree(Path(res.verdict["worktree"]))
    assert task_of(res.verdict).status == "APPLIED"


@pytest.mark.skipif(sandbox.abi() == 0, reason="this kernel has no Landlock")
def test_under_landlock_the_original_is_out_of_the_agent_s_reach(tmp_path: Path) -> None:
    src = plain(tmp_path)
    agent = write_agent(tmp_path, f'echo in-copy > mine.txt\nif echo x >> {src}/README; then echo wrote; fi')
    res = run_exec(src, agent, "--sandbox", "landlock")

    assert res.code == 0, res.stderr
    assert res.verdict["sandbox"].startswith("landlock")
    assert (src / "README").read_text() == "hello\n" and gates(res.verdict)["source-untouched"] == "pass"
    assert (Path(res.verdict["worktree"]) / "mine.txt").exists()


# --- apply, discard, restore ---------------------------------------------------------------------


def passed_task(tmp_path: Path, body: str, src: Path | None = None) -> tuple[Path, Task]:
    src = src or plain(tmp_path)
    res = run_exec(src, write_agent(tmp_path, body, name=f"agent{len(list(tmp_path.glob('agent*')))}.sh"))
    assert res.code == 0, (res.stderr, res.verdict["gates"])
    return src, task_of(res.verdict)


def test_apply_brings_every_kind_of_change_back(tmp_path: Path) -> None:
    src = plain(tmp_path, {"README": "hello\n", "tool.sh": "#!/bin/sh\n", "was-file": "f\n",
                           "was-dir/inner.txt": "i\n", "gone/deep/x.txt": "x\n", "link": "t\n"})
    body = """
chmod +x tool.sh
rm was-file && mkdir was-file && echo now-dir > was-file/a.txt
rm -r was-dir && echo now-file > was-dir
rm -r gone
mkdir -p new/deeper && echo fresh > new/deeper/f.txt
ln -s README readme-link
rm link && ln -s tool.sh link
"""
    src, task = passed_task(tmp_path, body, src)
    copy = Path(task.worktree)

    applied = copyexec.apply_copy(Registry(), task)

    assert tree(src) == tree(copy)
    assert stat.S_IMODE(os.lstat(src / "tool.sh").st_mode) & 0o111
    assert set(applied.added) >= {"new/deeper/f.txt", "readme-link", "was-file/a.txt"}
    assert set(applied.deleted) >= {"gone/deep/x.txt", "was-dir/inner.txt"}
    assert {"was-file", "was-dir", "link", "tool.sh"} <= set(applied.modified)
    assert Registry().get(task.id).status == "APPLIED"
    assert Registry().get(task.id).option("applied")["new"] == applied.new
    assert not [p for p in os.listdir(src) if p.startswith(".ccm-guard-apply-")]
    with pytest.raises(StateError, match="APPLIED"):
        copyexec.apply_copy(Registry(), Registry().get(task.id))


def test_apply_refuses_a_path_the_original_changed_since_and_changes_nothing(tmp_path: Path) -> None:
    src, task = passed_task(tmp_path, EDIT)
    (src / "src/app.txt").write_text("the person's edit\n")
    (src / "README").write_text("unrelated edit\n")
    before = tree(src)

    with pytest.raises(ApplyRefused) as refused:
        copyexec.apply_copy(Registry(), task)

    assert "1 path(s) changed" in refused.value.message and "src/app.txt" in refused.value.message
    assert "README" not in refused.value.message
    assert tree(src) == before  # nothing at all was written, not even docs/new.txt
    assert Registry().get(task.id).status == "COMMITTED"


def test_apply_keeps_the_person_s_unrelated_edits(tmp_path: Path) -> None:
    src, task = passed_task(tmp_path, EDIT)
    (src / "README").write_text("unrelated edit\n")
    (src / "mine.txt").write_text("added by the person\n")

    copyexec.apply_copy(Registry(), task)

    assert (src / "README").read_text() == "unrelated edit\n"
    assert (src / "mine.txt").read_text() == "added by the person\n"
    assert (src / "src/app.txt").read_text() == "a\nB\nc\nd\n" and (src / "docs/new.txt").exists()


def test_apply_refuses_when_the_original_gained_a_file_in_a_directory_the_agent_removed(tmp_path: Path) -> None:
    src = plain(tmp_path, {"README": "hello\n", "old/a.txt": "a\n"})
    src, task = passed_task(tmp_path, "rm -r old", src)
    (src / "old/b.txt").write_text("the person's new file\n")

    with pytest.raises(ApplyRefused, match="old"):
        copyexec.apply_copy(Registry(), task)

    assert (src / "old/a.txt").exists() and (src / "old/b.txt").exists()


def test_apply_never_writes_through_a_link_the_person_put_in_place_of_a_directory(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    src = plain(tmp_path, {"README": "hello\n", "sub/keep.txt": "k\n"})
    src, task = passed_task(tmp_path, "echo new > sub/new.txt", src)
    os.rename(src / "sub", tmp_path / "moved-sub")
    os.symlink(victim, src / "sub")

    with pytest.raises(ApplyRefused, match="sub/new.txt"):
        copyexec.apply_copy(Registry(), task)

    assert list(victim.iterdir()) == []


def test_apply_refuses_a_task_that_failed(tmp_path: Path) -> None:
    src = plain(tmp_path)
    res = run_exec(src, write_agent(tmp_path, "echo x > .gitignore"))
    with pytest.raises(StateError, match="ERRORED: only a task whose gates passed"):
        copyexec.apply_copy(Registry(), task_of(res.verdict))
    assert not (src / ".gitignore").exists()


def test_discard_archives_the_copy_and_restore_brings_it_back(tmp_path: Path) -> None:
    src, task = passed_task(tmp_path, EDIT)
    copy = Path(task.worktree)
    work = tree(copy)
    reg = Registry()

    done = copyexec.discard_copy(reg, task)

    archive = Path(done["archive"])
    assert not copy.exists() and tree(archive) == work
    assert reg.get(task.id).status == "DISCARDED" and done["restore"] == f"ccm-guard task restore {task.id}"
    with pytest.raises(StateError, match=f"already DISCARDED; its copy is archived at {archive}"):
        copyexec.discard_copy(reg, reg.get(task.id))

    copyexec.restore_copy(reg, reg.get(task.id))

    assert tree(copy) == work and not archive.exists() and reg.get(task.id).status == "COMMITTED"
    copyexec.apply_copy(reg, reg.get(task.id))
    assert (src / "docs/new.txt").read_text() == "new\n"
    done = copyexec.discard_copy(reg, reg.get(task.id))  # after an apply: cleaned up, still archived
    assert reg.get(task.id).status == "CLEANED_UP" and tree(Path(done["archive"])) == work


def test_a_directory_that_cannot_be_listed_blocks_the_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # An agent can chmod 000 a directory of its copy to hide what is in it from the walk;
    # root lists it anyway, so the refusal the kernel gives another user is made here.
    src, task = passed_task(tmp_path, "mkdir secret && echo x > secret/f.txt && echo new > docs/new.txt")
    hidden = os.path.join(task.worktree, "secret")
    real_scandir = os.scandir

    def refusing(path: Any) -> Any:
        if isinstance(path, (str, os.PathLike)) and os.fspath(path) == hidden:
            raise PermissionError(13, "Permission denied", hidden)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)  # os itself: the walk is in copytree
    before = tree(src)
    with pytest.raises(StateError, match=r"could not list secret \(Permission denied\).*nothing was applied"):
        copyexec.apply_copy(Registry(), task)
    verdict = copyexec.judge_copy(task, copyexec.read_manifest(task), copyexec.Checks.of(None))
    monkeypatch.undo()

    assert tree(src) == before
    assert verdict.exit_code == 1 and "could not list 1 director(ies) in the copy" in verdict.errors[0]


def test_line_counts_are_git_s_even_for_files_that_would_stall_difflib(tmp_path: Path) -> None:
    # 101 distinct lines, each just under difflib's 1% junk threshold: Python's
    # SequenceMatcher needs minutes for this pair; git's diff does not.
    lines = [f"l{i}\n" for i in range(101)]
    old = "".join(lines[i % 101] for i in range(13000))
    new = "".join(lines[(i * 7) % 101] for i in range(13000))
    src = plain(tmp_path, {"data.txt": old})
    (tmp_path / "new.txt").write_text(new)
    res = run_exec(src, write_agent(tmp_path, f"cp {tmp_path / 'new.txt'} data.txt"))

    assert res.code == 0, res.stderr
    expected = git_numstat(src / "data.txt", tmp_path / "new.txt")
    assert [(f["path"], f["added"], f["deleted"]) for f in res.verdict["files"]] == [("data.txt", *expected)]


def git_numstat(old: Path, new: Path) -> tuple[int, int]:
    out = subprocess.run(["git", "diff", "--no-index", "--numstat", str(old), str(new)],
                         capture_output=True, text=True).stdout
    added, deleted, _ = out.split("\t", 2)
    return int(added), int(deleted)


def test_discard_and_restore_of_a_copied_directory_through_the_command_line(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "a.txt").write_text("a\n")
    assert run_exec(plain, write_agent(tmp_path, "echo b >> a.txt\n"), "--task", "cp").code == 0
    assert ccm("task", "discard", "cp", cwd=tmp_path).returncode == 0
    restored = ccm("task", "restore", "cp", cwd=tmp_path)
    assert restored.returncode == 0 and "Traceback" not in restored.stderr, restored.stderr
    assert restored.stdout.startswith("ccm-guard: restored task cp in ") and "(a copied directory)" in restored.stdout
    again = ccm("task", "restore", "cp", "--json", cwd=tmp_path)
    assert again.returncode == 7 and json.loads(again.stdout)["exit_code"] == 7
    for command in (["task", "diff", "cp"], ["task", "snapshot", "cp"], ["task", "rollback", "cp"], ["audit", "cp"]):
        refused = ccm(*command, cwd=tmp_path)  # git-only: said so, with what to do instead
        assert refused.returncode == 2 and "ran in a copied directory, which has no git" in refused.stderr
        assert f"diff -ru {plain}" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
