"""Git config files: reading and writing them through git, key-by-key differences, and
the keys that make git run code.

A config change is reported key by key; the keys that run a program or steer git to
other files are named loudly, and their presence in a changed file makes ccm-guard
stop running git on that repository.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple, Sequence

from ccm_guard.errors import GitError
from ccm_guard.git.base import binary
from ccm_guard.git.core import Repo, describe_failure, run

# --- reading and writing config through git ----------------------------------------------------


READ_LIMIT = 1 << 20  # a larger config file is left to git to read by name


def file_entries(path: Path, data: bytes | None) -> list[tuple[str, str]]:
    """The keys of the config file `path`, whose bytes the caller read (`data`; None where it
    could not): parsed by content where small (the snapshots parse the same bytes, so git is
    asked once for both), else by git reading the file by name, which also names it in an
    error (bytes git cannot parse are read again so)."""
    if data is not None and len(data) <= READ_LIMIT:
        try:
            return entries(data)
        except GitError:
            pass
    return config_entries(path)


def config_entries(path: Path) -> list[tuple[str, str]]:
    """The key/value pairs of one config file, as git itself parses them; includes not followed.

    Reading a config file runs nothing, whoever wrote it.
    """
    res = run(["config", "--file", str(path), "--no-includes", "--list", "-z"], check=False)
    if res.returncode != 0:
        raise GitError(f"{path} is not a valid git config file: {describe_failure(res)}")
    pairs = []
    for record in res.z():
        key, _, value = record.partition("\n")
        pairs.append((key, value))
    return pairs


def may_set(data: bytes, key: str) -> bool:
    """Whether config bytes can set `key` at all: a variable's name is spelled out, without
    escapes or line continuations, in any file that sets it (includes aside), so a file
    that does not spell it (most files, for most keys) needs no git process to say so."""
    return key.rsplit(".", 1)[-1].lower().encode() in data.lower()


def config_file_set(path: Path, key: str, value: str | None) -> None:
    """Set `key` in the config file `path`, or (None) remove every value of it."""
    if value is None:
        run(["config", "--file", str(path), "--unset-all", key], check=False)  # absent already: fine
    else:
        run(["config", "--file", str(path), key, value])


_SECTION = re.compile(r"[A-Za-z0-9-]+")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
_UNSPELLED = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but the tab (newlines are escaped)


def config_file_create(path: Path, pairs: Sequence[tuple[str, str]]) -> bool:
    """Write a new config file holding `pairs`, in one go and without a git process; False,
    with nothing written, where the file exists already (git edits that, under its lock) or
    a key or value is one this writer does not spell (a subsection, a control character).

    For the files ccm-guard makes for a new task (its config.worktree): three `git config`
    processes fewer on every exec, and the snapshots that parse these bytes need not ask
    git either. The file appears whole or not at all (written aside, then linked into
    place, which fails if anything took the name meanwhile)."""
    sections: dict[str, list[tuple[str, str]]] = {}  # by section, case-folded as git takes it
    for key, value in pairs:
        section, _, name = key.partition(".")
        if not (_SECTION.fullmatch(section) and _NAME.fullmatch(name)) or _UNSPELLED.search(value.replace("\n", "")):
            return False
        sections.setdefault(section.lower(), []).append((name, value))
    mode = _new_file_mode()
    # Values are written as UTF-8: where names are not (another locale), git's own spelling wins.
    if os.path.lexists(path) or mode is None or sys.getfilesystemencoding() != "utf-8":
        return False
    text = "".join(f"[{section}]\n" + "".join(f'\t{name} = "{_quoted(value)}"\n' for name, value in keys)
                   for section, keys in sections.items())
    data = text.encode("utf-8", "surrogateescape")
    fd, aside = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".new")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(aside, mode)  # as git would make it (mkstemp's is 0600)
        os.link(aside, path)
    except OSError:  # the name taken meanwhile, or a file system without hard links: git's turn
        return False
    finally:
        os.unlink(aside)
    # What git lists for these bytes (a test holds the two equal).
    _remember(data, tuple((f"{section}.{name.lower()}", value) for section, keys in sections.items()
                          for name, value in keys))
    return True


def _new_file_mode() -> int | None:
    """0666 less the umask, as git creates a file; the umask read where setting it to learn
    it would change it for every thread meanwhile. None where it cannot be read."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")


def remote_url(repo: Repo, name: str) -> str | None:
    res = run(["config", "--get", f"remote.{name}.url"], repo, check=False)
    return res.out.strip() or None


IDENTITY_VARIABLES = ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "GIT_COMMITTER_EMAIL")


def person_identity(directory: Path) -> dict[str, str]:
    """Who commits in `directory` as the person's git sees it: user.name and user.email from
    their config (includeIf conditions evaluated there), as the GIT_AUTHOR_*/GIT_COMMITTER_*
    variables; those already in the environment win. Empty when nothing says who."""
    if all(os.environ.get(name) for name in IDENTITY_VARIABLES):
        return {name: os.environ[name] for name in IDENTITY_VARIABLES}  # nothing left to ask git
    found = _identity_in_files(directory)
    if found is None:
        found = _identity_by_git(directory)
    identity = {}
    for role in ("AUTHOR", "COMMITTER"):
        for key in ("name", "email"):
            name = f"GIT_{role}_{key.upper()}"
            chosen = os.environ.get(name) or found.get(key)
            if chosen:
                identity[name] = chosen
    return identity


def _identity_by_git(directory: Path) -> dict[str, str]:
    res = run(["config", "-z", "--get-regexp", r"^user\.(name|email)$"], cwd=directory, check=False,
              person_config=True)
    found = {}
    for record in res.z() if res.returncode == 0 else []:
        key, _, value = record.partition("\n")
        found[key.removeprefix("user.")] = value  # the last one wins, as for `git config --get`
    return found


def _identity_in_files(directory: Path) -> dict[str, str] | None:
    """user.name and user.email as `git config` run in `directory`, a main checkout, finds
    them, read from the files without a git process: the system config (for a git in
    /usr/bin, whose is /etc/gitconfig), the global ones, the repository's and its worktree
    config, later ones winning. None where git must be asked: a linked worktree, a file
    not written plainly, or an include (whose conditions git evaluates)."""
    common = directory / ".git"
    try:
        if not os.path.isdir(common) or {os.stat(common).st_uid, os.stat(directory).st_uid} != {os.getuid()}:
            return None  # a linked worktree; one git would not trust (safe.directory)
    except OSError:
        return None
    if not os.environ.get("HOME") or any(
            name in os.environ and not os.path.isabs(os.environ[name])
            for name in ("GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL", "XDG_CONFIG_HOME")):
        return None  # empty or relative: git's rules for those are not copied here
    files: list[Path] = []
    nosystem = _BOOLEANS.get(os.environ.get("GIT_CONFIG_NOSYSTEM", "0").lower() or "0")
    if nosystem is None:
        return None
    if not nosystem:
        system = os.environ.get("GIT_CONFIG_SYSTEM")
        if system is None and os.path.realpath(binary()) != "/usr/bin/git":
            return None  # its system config is where it was built to look
        files.append(Path(system if system is not None else "/etc/gitconfig"))
    chosen = os.environ.get("GIT_CONFIG_GLOBAL")
    files += [Path(chosen)] if chosen is not None else global_config_files()
    files += [common / "config", common / "config.worktree"]
    found: dict[str, str] = {}
    local: dict[str, str] = {}
    for path in files:
        if path.name == "config.worktree":
            # Git reads extensions.worktreeConfig where the repository states its format
            # version (0 or 1), not where it states none.
            version = local.get("core.repositoryformatversion")
            enabled = local.get("extensions.worktreeconfig", "false").lower()
            if version not in (None, "0", "1") or enabled not in _BOOLEANS:
                return None  # spelled in a way git reads by rules not copied here
            if version is None or not _BOOLEANS[enabled]:
                continue
        try:
            data = path.read_bytes() if path != Path("/dev/null") else b""
        except FileNotFoundError:
            continue
        except OSError:
            return None
        pairs = _parse_plain(data) if len(data) <= READ_LIMIT else None
        if pairs is None:
            return None
        for key, value in pairs:
            if key.startswith(("include.", "includeif.")):
                return None
            if key in ("user.name", "user.email"):
                found[key[len("user."):]] = value
            elif path == common / "config":
                local[key] = value
    return found


_BOOLEANS = {"true": True, "yes": True, "on": True, "1": True,
             "false": False, "no": False, "off": False, "0": False}


def person_excludes(directory: Path) -> Path:
    """The person's global ignore file, as their git sees it in `directory`: core.excludesFile,
    or git's default place for it."""
    res = run(["config", "--type=path", "--get", "core.excludesFile"], cwd=directory, check=False,
              person_config=True)
    if res.returncode == 0 and res.out.strip():
        return Path(directory, res.out.strip())
    return _xdg_git() / "ignore"


def global_config_files() -> list[Path]:
    """Where git looks for the user's global config, lowest precedence first (what
    GIT_CONFIG_GLOBAL would put in their place is the caller's to decide)."""
    return [_xdg_git() / "config", Path(os.path.expanduser("~/.gitconfig"))]


def _xdg_git() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "git")


# --- what a change means ------------------------------------------------------------------------
# Matched against the lower-cased key with the subsection removed ("filter.<x>.clean"
# becomes "filter.*.clean"); subsections are the one case-sensitive part of a key.
_DANGEROUS = re.compile(
    r"""^(
        core\.(hookspath|fsmonitor|sshcommand|pager|editor|askpass|gitproxy|worktree
              |attributesfile|excludesfile|alternaterefscommand|bare|repositoryformatversion)
      | sequence\.editor
      | diff\.external | diff\.\*\.(textconv|command)
      | difftool\.\*\.(cmd|path) | mergetool\.\*\.(cmd|path) | merge\.\*\.driver
      | filter\.\*\.(clean|smudge|process)
      | credential\.helper | credential\.\*\.helper
      | include\.path | includeif\.\*\.path
      | gpg\.program | gpg\.\*\.program | gpg\.\*\.defaultkeycommand
      | uploadpack\.packobjectshook
      | pager\.[^.]+ | pager\.\*
      | trailer\.\*\.(cmd|command)
      | hook\.\*\.command
      | sendemail\.(smtpserver|tocmd|cccmd|headercmd|sendmailcmd) | sendemail\.\*\.(smtpserver|tocmd|cccmd|headercmd|sendmailcmd)
      | tar\.\*\.command
      | lfs\.\*\.path | lfs\.standalonetransferagent
      | init\.templatedir
      | instaweb\.(httpd|browser)
      | imap\.tunnel
      | guitool\.\*\.cmd
      | interactive\.difffilter
      | remote\.\*\.(uploadpack|receivepack|vcs|url|pushurl|proxy)
      | url\.\*\.(insteadof|pushinsteadof)
      | protocol\.\*\.allow | protocol\.allow
      | submodule\.\*\.update
      | extensions\.\w+
      | ssh\.variant
      | browser\.\*\.(cmd|path) | web\.browser | man\.\*\.(cmd|path) | man\.viewer
    )$""",
    re.VERBOSE,
)


def generic_key(key: str) -> str:
    section, _, rest = key.partition(".")
    if "." in rest:  # section.subsection.name
        return f"{section.lower()}.*.{rest.rsplit('.', 1)[1].lower()}"
    return key.lower()


# An alias runs a shell with "!", and may carry git's global options that run code.
_DANGEROUS_ALIAS = re.compile(r"^\s*!|(^|\s)(-c|--config-env|--exec-path|--git-dir|--work-tree)(\s|=|$)")


def is_dangerous(key: str, value: str) -> bool:
    if key.lower().startswith("alias."):
        return bool(_DANGEROUS_ALIAS.search(value))
    return bool(_DANGEROUS.match(generic_key(key)))


class ConfigChange(NamedTuple):
    key: str
    before: tuple[str, ...]
    after: tuple[str, ...]
    dangerous: bool

    @property
    def ccm_guard_setup(self) -> bool:
        """The one shared setting exec itself makes (per-worktree hooks need it): seen by a
        task that was already running when another task was set up for the first time."""
        return self.key == "extensions.worktreeconfig" and self.before == () and self.after == ("true",)

    def describe(self) -> str:
        def show(values: tuple[str, ...]) -> str:
            return ", ".join(repr(v) for v in values) if values else "(unset)"

        flag = "DANGEROUS (runs code or steers git) " if self.dangerous else ""
        return f"{flag}{self.key}: {show(self.before)} -> {show(self.after)}"


def entries(data: bytes) -> list[tuple[str, str]]:
    """Parse config bytes exactly as git does (through `git config --file`). A run reads
    the same small files in both snapshots: those are parsed once per process, and the
    bytes config_file_create wrote are known without asking."""
    if len(data) > _PARSED_LIMIT:
        return _parse(data)
    if data not in _PARSED:
        _remember(data, tuple(_parse(data)))
    return list(_PARSED[data])


def _remember(data: bytes, pairs: tuple[tuple[str, str], ...]) -> None:
    if len(data) > _PARSED_LIMIT:
        return
    if len(_PARSED) >= 32:
        _PARSED.pop(next(iter(_PARSED)))  # the oldest
    _PARSED[data] = pairs


_PARSED_LIMIT = 1 << 16  # larger files are parsed each time, not kept
_PARSED: dict[bytes, tuple[tuple[str, str], ...]] = {}


def _parse(data: bytes) -> list[tuple[str, str]]:
    plain = _parse_plain(data)
    if plain is not None:
        return plain
    fd, name = tempfile.mkstemp(prefix="ccm-guard-config-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return config_entries(Path(name))
    finally:
        os.unlink(name)


# The spelling of config that git reads one way only, and the one tools write: `[section]` or
# `[section "subsection"]`, and `name = value` without quotes, escapes, comments or tabs in
# the value. Anything else, or anything git would refuse, is git's to parse.
# (No pattern here can backtrack over a run of blanks: an agent writes some of these files.)
_PLAIN_HEADER = re.compile(r'\[([A-Za-z0-9-]+)(?: "([^"\\\x00-\x1f\x7f]+)")?\][ \t]*')
_PLAIN_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]*")
_NOT_PLAIN_VALUE = re.compile(r'["\\#;\x00-\x1f\x7f]')


def _parse_plain(data: bytes) -> list[tuple[str, str]] | None:
    """What `git config --file --no-includes --list` gives for config bytes written plainly,
    without a git process (one fewer on every exec); None for anything else (a test holds
    the two readings equal over a corpus of spellings)."""
    if b"\r" in data or b"\0" in data or data.startswith(b"\xef\xbb\xbf"):
        return None
    pairs: list[tuple[str, str]] = []
    section = None
    for line in data.decode("utf-8", "surrogateescape").split("\n"):
        line = line.lstrip(" \t")
        if not line or line[0] in "#;":
            continue
        if line[0] == "[":
            header = _PLAIN_HEADER.fullmatch(line)
            if header is None:
                return None
            name, sub = header.groups()
            section = name.lower() if sub is None else f"{name.lower()}.{sub}"
            continue
        name, _, value = line.partition("=")
        name, value = name.rstrip(" \t"), value.strip(" \t")
        if section is None or not _PLAIN_NAME.fullmatch(name) or _NOT_PLAIN_VALUE.search(value):
            return None
        pairs.append((f"{section}.{name.lower()}", value))
    return pairs


def object_format(common_dir: Path) -> str:
    """The repository's object format ("sha1" or "sha256"), from its config's
    extensions.objectFormat (read without git)."""
    try:
        data = (common_dir / "config").read_bytes()
    except OSError:
        return "sha1"
    values = values_of(data, "extensions.objectformat") if b"objectformat" in data.lower() else ()
    return values[-1].lower() if values and values[-1] else "sha1"


def values_of(data: bytes, key: str) -> tuple[str, ...] | None:
    """Every value of `key` in config bytes, in order; None when git cannot parse them."""
    try:
        return _by_key(entries(data)).get(_normal_key(key), ())
    except GitError:
        return None


def _by_key(pairs: list[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    grouped: dict[str, list[str]] = {}
    for key, value in pairs:
        grouped.setdefault(_normal_key(key), []).append(value)
    return {k: tuple(v) for k, v in grouped.items()}


def _normal_key(key: str) -> str:
    section, _, rest = key.partition(".")
    if "." in rest:
        sub, _, name = rest.rpartition(".")
        return f"{section.lower()}.{sub}.{name.lower()}"
    return key.lower()


def diff(before: bytes | None, after: bytes | None) -> list[ConfigChange]:
    """Key-by-key differences; a file that git cannot parse is itself one dangerous change."""
    try:
        old = _by_key(entries(before)) if before is not None else {}
        new = _by_key(entries(after)) if after is not None else {}
    except GitError as exc:
        return [ConfigChange("(unparseable config)", (), (exc.message,), True)]
    changes = []
    for key in sorted(set(old) | set(new)):
        if old.get(key, ()) != new.get(key, ()):
            values = old.get(key, ()) + new.get(key, ())
            danger = any(is_dangerous(key, v) for v in values) or (not values and is_dangerous(key, ""))
            changes.append(ConfigChange(key, old.get(key, ()), new.get(key, ()), danger))
    return changes


def hooks_paths(data: bytes) -> list[str]:
    """The `core.hooksPath` values of config bytes, `~` expanded as git does (a relative one
    is relative to the top of the work tree git runs in)."""
    if not may_set(data, "core.hooksPath"):
        return []  # the common case costs no git call
    return [os.path.expanduser(v) for k, v in entries(data) if k.lower() == "core.hookspath" and v]


def include_targets(config_path: Path, data: bytes) -> list[Path]:
    """Files a config includes (include.path, includeIf.*.path), as absolute paths."""
    if b"include" not in data.lower():
        return []  # the common case costs no git call
    targets = []
    for key, value in entries(data):
        if generic_key(key) in ("include.path", "includeif.*.path") and value:
            expanded = os.path.expanduser(value)
            path = Path(expanded) if os.path.isabs(expanded) else config_path.parent / expanded
            targets.append(path)
    return targets


# Keys whose code git would run even under ccm-guard's hardening (which switches off
# hooks, fsmonitor, pagers, editors, external diff, textconv, signing and credentials).
_RUNS_DESPITE_HARDENING = re.compile(r"^(filter\.\*\.(clean|smudge|process)|include\.path|includeif\.\*\.path|core\.attributesfile)$")


def unsafe_to_run(*paths: Path) -> str | None:
    """Why git must not be run on a repository whose config we have no baseline for."""
    for path in paths:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        keys = [k for k, _ in entries(data) if _RUNS_DESPITE_HARDENING.match(generic_key(k))]
        if keys:
            return f"{path} sets {', '.join(sorted(set(keys)))}, which would run code ccm-guard cannot switch off"
    return None
