"""The person's identity read from their config files without a git process
(git.config._identity_in_files), held equal to what git itself answers, and handed to git
wherever the files are not plain."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import git, make_repo

from ccm_guard.git import config

CASES = {
    "nothing": ({}, {}),
    "global only": ({"~/.gitconfig": "[user]\n\tname = Ada\n\temail = ada@example.com\n"}, {}),
    "xdg then home, home wins": ({"~/.config/git/config": "[user]\n\tname = X\n\temail = x@example.com\n",
                                  "~/.gitconfig": "[user]\n\tname = Home\n"}, {}),
    "repository wins over global": ({"~/.gitconfig": "[user]\n\tname = Ada\n\temail = ada@example.com\n",
                                     "config": "[user]\n\temail = work@example.com\n"}, {}),
    "last of many": ({"~/.gitconfig": "[user]\nname = A\n[User]\n  NAME = B\n[user \"x\"]\nname = C\n"}, {}),
    "worktree config when enabled": ({"config": "[extensions]\n\tworktreeConfig = true\n[user]\n\tname = R\n",
                                      "config.worktree": "[user]\n\tname = W\n"}, {}),
    "worktree config in a version 1 repository": (
        {"config": "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tworktreeConfig = true\n[user]\n\tname = R\n",
         "config.worktree": "[user]\n\tname = W\n"}, {}),
    "worktree config in a version 0 repository": (
        {"config": "[core]\n\trepositoryformatversion = 0\n[extensions]\n\tworktreeConfig = true\n[user]\n\tname = R\n",
         "config.worktree": "[user]\n\tname = W\n"}, {}),
    "worktree config when not": ({"config": "[user]\n\tname = R\n", "config.worktree": "[user]\n\tname = W\n"}, {}),
    "GIT_CONFIG_GLOBAL elsewhere": ({"~/other": "[user]\n\tname = Other\n", "~/.gitconfig": "[user]\n\tname = No\n"},
                                    {"GIT_CONFIG_GLOBAL": "~/other"}),
    "XDG_CONFIG_HOME": ({"~/xdg/git/config": "[user]\n\temail = xdg@example.com\n"}, {"XDG_CONFIG_HOME": "~/xdg"}),
}


def _lay_out(tmp_path: Path, repo: Path, files: dict[str, str], env: dict[str, str],
             monkeypatch: pytest.MonkeyPatch) -> None:
    home = Path.home()
    for name, text in files.items():
        path = home / name[2:] if name.startswith("~/") else repo / ".git" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (home / ".gitconfig").touch()
    for name, value in env.items():
        monkeypatch.setenv(name, value.replace("~", str(home)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_files_give_what_git_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    repo = make_repo(tmp_path / "repo")
    files, env = CASES[case]
    (Path.home() / ".gitconfig").unlink()
    _lay_out(tmp_path, repo, files, env, monkeypatch)
    read = config._identity_in_files(repo)
    assert read is not None, case
    assert read == config._identity_by_git(repo), case


@pytest.mark.parametrize("text", ["[include]\n\tpath = other\n", '[includeIf "gitdir:~/projects/"]\n\tpath = w\n',
                                  '[user]\n\tname = "Quoted"\n', "[user]\n\tname = A # comment\n",
                                  "[user]\r\n\tname = A\r\n"])
def test_a_file_not_written_plainly_is_left_to_git(tmp_path: Path, text: str) -> None:
    repo = make_repo(tmp_path / "repo")
    (Path.home() / ".gitconfig").write_text(text)
    assert config._identity_in_files(repo) is None


def test_a_linked_worktree_is_left_to_git(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    git(repo, "worktree", "add", "-q", str(tmp_path / "wt"))
    assert config._identity_in_files(tmp_path / "wt") is None
    (Path.home() / ".gitconfig").write_text("[user]\n\tname = Ada\n\temail = ada@example.com\n")
    assert config.person_identity(tmp_path / "wt") == {  # through git, as before
        "GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada", "GIT_COMMITTER_EMAIL": "ada@example.com"}


def test_the_system_config_is_read_where_git_reads_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_repo(tmp_path / "repo")
    system = tmp_path / "system"
    system.write_text("[user]\n\tname = System\n")
    monkeypatch.delenv("GIT_CONFIG_NOSYSTEM")
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(system))
    (Path.home() / ".gitconfig").write_text("[user]\n\temail = ada@example.com\n")
    assert config._identity_in_files(repo) == config._identity_by_git(repo) == {
        "name": "System", "email": "ada@example.com"}


@pytest.mark.parametrize("variable", ["GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL", "XDG_CONFIG_HOME", "HOME"])
@pytest.mark.parametrize("value", ["", "relative"])
def test_an_empty_or_relative_location_is_left_to_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       variable: str, value: str) -> None:
    repo = make_repo(tmp_path / "repo")
    monkeypatch.setenv(variable, value)
    if variable == "HOME" and value:
        monkeypatch.setenv(variable, str(tmp_path))  # a HOME that is set is fine
        assert config._identity_in_files(repo) is not None
        return
    assert config._identity_in_files(repo) is None
