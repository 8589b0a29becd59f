"""Roles and their rules: built in, overridden by TOML files, validated strictly.

Layers, later ones winning key by key: the built-in roles; the user's default
(`$CCM_GUARD_HOME/policy.toml`); the repository's `.ccm-guard.toml` (or
`[tool.ccm-guard]` in `pyproject.toml`) read from the base commit, never from the
agent's worktree (the agent could edit it); and `--policy FILE`. A bad file is an error
naming the file, the line and the key, never a silent default.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import re
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from ccm_guard.errors import UsageError
from ccm_guard.files import open_regular
from ccm_guard.state.home import home

POLICY_FILE = ".ccm-guard.toml"
POLICY_TABLE_FILE = "pyproject.toml"  # its [tool.ccm-guard] table is policy too

# Paths that steer git itself or this policy: no built-in role may change them.
CONTROL_PATHS = ("**/.git", "**/.gitattributes", "**/.gitmodules", "**/.gitignore", "/" + POLICY_FILE)
TEST_PATHS = ("tests/", "test/", "spec/", "specs/", "__tests__/", "test_*.py", "*_test.*", "*.test.*", "*.spec.*")
GIT_CLASSES = ("remote", "switch", "worktree", "submodule", "merge", "config-write", "ref-write",
               "reset-outside", "gc", "no-verify", "dangerous-config", "redirect")


class PolicyError(UsageError):
    """A policy file that cannot be used as written."""


@dataclasses.dataclass(frozen=True)
class Limits:
    """The size limits a role sets on a run (None: no limit)."""

    max_file_bytes: int | None = None  # the largest file the run may add or change
    max_added_bytes: int | None = None  # bytes the run may add in all (growth of changed files)
    max_files: int | None = None  # paths the run may change
    max_commits: int | None = None  # commits the run may make


@dataclasses.dataclass(frozen=True)
class Role:
    """What an agent in this role may do: paths, commits, limits, what git may be asked."""

    name: str
    allow: tuple[str, ...] | None = None  # gitignore-style; None: everything not forbidden
    forbid: tuple[str, ...] = ()
    must_commit: bool = True
    read_only: bool = False  # HEAD and the branch may not move
    git_allow: tuple[str, ...] = ()  # git shim operation classes this role may use anyway
    limits: Limits = Limits()
    output: str | None = None  # where a read-only role writes its verdict (outside the worktree)
    snapshot_every: int = 10  # exec keeps a snapshot ref at every Nth commit of a run (0: none)
    # A change to files CI or git hooks run by themselves (.github/workflows/, .husky/,
    # .pre-commit-config.yaml, ...): "fail" (default) or "warn" (a role whose work is CI).
    ci_files: str = "fail"
    # A change to files that direnv, editors or the next agent obey by themselves (.envrc,
    # .vscode/, .claude/, AGENTS.md, ...): "fail" or "warn"; None: fail for a role with an
    # `allow` list (its allow must not admit them), warn for the others.
    run_files: str | None = None
    # Commands run in the fresh worktree before the agent, in its sandbox (run/setup.py),
    # and how long they may take together, in seconds.
    setup: tuple[str, ...] = ()
    setup_timeout: int = 600
    sources: tuple[tuple[str, str], ...] = ()  # (key, where its value came from)

    @property
    def run_files_severity(self) -> str:
        return self.run_files or ("fail" if self.allow is not None else "warn")

    def source_of(self, key: str) -> str:
        return dict(self.sources).get(key, "built-in")


BUILTIN: dict[str, dict[str, Any]] = {
    "implementor": {"forbid": list(CONTROL_PATHS), "must_commit": True},
    "test-writer": {"allow": list(TEST_PATHS), "forbid": list(CONTROL_PATHS), "must_commit": True},
    "reviewer": {"allow": [], "forbid": list(CONTROL_PATHS), "must_commit": False, "read_only": True},
    "qa": {"forbid": list(CONTROL_PATHS), "must_commit": True},
}
DEFAULT_ROLE = "implementor"

_ROLE_KEYS: dict[str, type] = {
    "extends": str, "allow": list, "forbid": list, "must_commit": bool, "read_only": bool,
    "git_allow": list, "limits": dict, "output": str, "snapshot_every": int, "ci_files": str,
    "run_files": str,
    "setup": list, "setup_timeout": int,
}
_TOP_KEYS = ("default_role", "roles", "setup", "setup_timeout")  # setup*: for roles that set none
_KIND = {str: "a string", list: "a list", bool: "true or false", dict: "a table", int: "a whole number"}
_LIMIT_KEYS = {f.name for f in dataclasses.fields(Limits)}
_ROLE_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


@dataclasses.dataclass
class Policy:
    """The roles in force for a repository, and the files they came from."""

    roles: dict[str, Role]
    default_role: str
    files: list[str]  # the files that contributed, in order

    def role(self, name: str | None) -> Role:
        name = name or self.default_role
        if name not in self.roles:
            raise PolicyError(f"unknown role {name!r}: choose one of {', '.join(sorted(self.roles))} "
                              "or define it under [roles.NAME] in .ccm-guard.toml")
        return self.roles[name]


class Source(NamedTuple):
    """A policy file's text and the name to blame in errors (a path, or REV:path)."""

    name: str
    text: str
    table: tuple[str, ...] = ()  # where the policy sits inside the file ("tool", "ccm-guard")


def build(sources: list[Source]) -> Policy:
    raw: dict[str, dict[str, Any]] = {name: dict(spec) for name, spec in BUILTIN.items()}
    origin: dict[str, dict[str, str]] = {name: {} for name in BUILTIN}
    default, default_from = DEFAULT_ROLE, None
    top: dict[str, tuple[Any, str]] = {}  # setup, setup_timeout at the top: (value, file)
    for source in sources:
        data = _parse(source)
        if data is None:
            continue
        chosen = _merge(source, data, raw, origin)
        if chosen:
            default, default_from = chosen, source
        top.update({key: (data[key], source.name) for key in ("setup", "setup_timeout") if key in data})
    for name, spec in raw.items():  # a role's own setup wins over the top-level one
        for key, (value, where) in top.items():
            if key not in spec:
                spec[key] = value
                origin[name][key] = where
    roles = {name: _make_role(name, raw, origin, sources) for name in raw}
    if default not in roles:
        _bad(default_from or Source("built-in", ""), (), "default_role", f"default_role {default!r} is not a role: define [roles.{default}] "
                                               "or pick another")
    return Policy(roles, default, [s.name for s in sources])


def _parse(source: Source) -> dict[str, Any] | None:
    import tomllib  # here, not at the top: the pre-commit hook imports this module on every commit

    try:
        data: Any = tomllib.loads(source.text)
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise PolicyError(f"{source.name}:{line.group(1) if line else '?'}: not valid TOML ({exc}); fix the syntax") from exc
    for key in source.table:
        data = data.get(key) if isinstance(data, dict) else None
        if data is None:
            return None
    if not isinstance(data, dict):
        raise PolicyError(f"{source.name}: [{'.'.join(source.table)}] must be a table")
    return data


def _merge(source: Source, data: dict[str, Any], raw: dict[str, dict[str, Any]],
           origin: dict[str, dict[str, str]]) -> str | None:
    for key in data:
        if key not in _TOP_KEYS:
            _bad(source, (), key, "unknown key (expected default_role, setup, setup_timeout or [roles.NAME])")
    _check_setup(source, (), data)
    roles = data.get("roles", {})
    if not isinstance(roles, dict):
        _bad(source, (), "roles", "must be a table of roles")
    for name, spec in roles.items():
        if not _ROLE_NAME.match(name):
            _bad(source, ("roles",), name, "role names are lower-case letters, digits, '-' and '_'")
        if not isinstance(spec, dict):
            _bad(source, ("roles",), name, "must be a table")
        _check_role(source, name, spec)
        base = spec.get("extends")
        if base is not None and base not in raw:
            _bad(source, ("roles", name), "extends", f"unknown role {base!r}")
        target = raw.setdefault(name, dict(raw[base]) if base else {})
        origin.setdefault(name, dict(origin.get(base, {})) if base else {})
        for key, value in spec.items():
            if key == "extends":
                continue
            if key == "limits":
                target["limits"] = {**target.get("limits", {}), **value}
                for lk in value:
                    origin[name][f"limits.{lk}"] = source.name
            else:
                target[key] = value
                origin[name][key] = source.name
    default = data.get("default_role")
    if default is not None and not isinstance(default, str):
        _bad(source, (), "default_role", "must be a string")
    return default


def _check_role(source: Source, name: str, spec: dict[str, Any]) -> None:
    where = ("roles", name)
    for key, value in spec.items():
        if key not in _ROLE_KEYS:
            _bad(source, where, key, f"unknown key (expected one of {', '.join(_ROLE_KEYS)})")
        if not isinstance(value, _ROLE_KEYS[key]):
            _bad(source, where, key, f"must be {_KIND[_ROLE_KEYS[key]]}")
        if key in ("allow", "forbid"):
            for pattern in value:
                if not isinstance(pattern, str) or not pattern.strip():
                    _bad(source, where, key, f"patterns must be non-empty strings, not {pattern!r}")
                _check_pattern(source, where, key, pattern)
        if key in ("setup", "setup_timeout"):
            _check_setup(source, where, spec)
        if key in ("ci_files", "run_files") and value not in ("fail", "warn"):
            _bad(source, where, key, 'must be "fail" or "warn"')
        if key == "snapshot_every" and (isinstance(value, bool) or value < 0):
            _bad(source, where, key, "must be a whole number, 0 or more (0: no automatic snapshots)")
        if key == "git_allow":
            unknown = [c for c in value if c not in GIT_CLASSES]
            if unknown:
                _bad(source, where, key, f"unknown git operation class {unknown[0]!r} (known: {', '.join(GIT_CLASSES)})")
        if key == "limits":
            for lk, lv in value.items():
                if lk not in _LIMIT_KEYS:
                    _bad(source, (*where, "limits"), lk, f"unknown limit (expected one of {', '.join(sorted(_LIMIT_KEYS))})")
                if not isinstance(lv, int) or isinstance(lv, bool) or lv < 0:
                    _bad(source, (*where, "limits"), lk, "must be a whole number, 0 or more")


def _check_setup(source: Source, where: tuple[str, ...], table: dict[str, Any]) -> None:
    commands, timeout = table.get("setup", []), table.get("setup_timeout", 1)
    if not isinstance(commands, list) or not all(isinstance(c, str) and c.strip() for c in commands):
        _bad(source, where, "setup", 'must be a list of commands, e.g. ["npm ci"]')
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
        _bad(source, where, "setup_timeout", "must be a whole number of seconds, more than 0")


def _check_pattern(source: Source, where: tuple[str, ...], key: str, pattern: str) -> None:
    from ccm_guard.pathrules.matcher import Matcher

    try:
        Matcher([pattern])
    except ValueError as exc:
        _bad(source, where, key, f"bad pattern {pattern!r}: {exc}")


def _bad(source: Source, table: tuple[str, ...], key: str, problem: str) -> None:
    line = _line_of(source.text, (*source.table, *table), key)
    dotted = ".".join((*table, key))
    raise PolicyError(f"{source.name}:{line}: {dotted}: {problem}")


def _line_of(text: str, table: tuple[str, ...], key: str) -> str:
    """The line a key is set on, found by reading the file as a person would."""
    current: tuple[str, ...] = ()
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        header = re.match(r"^\[+\s*([^\]]+?)\s*\]+", stripped)
        if header:
            current = tuple(part.strip().strip('"') for part in header.group(1).split("."))
            if current == (*table, key):
                return str(number)
            continue
        name = re.match(r'^"?([^"=\s]+)"?\s*=', stripped)
        if name and name.group(1) == key and current == table:
            return str(number)
    return "?"


def _make_role(name: str, raw: dict[str, dict[str, Any]], origin: dict[str, dict[str, str]],
               sources: list[Source]) -> Role:
    spec = raw[name]
    allow = spec.get("allow")
    return Role(
        name=name,
        allow=tuple(allow) if allow is not None else None,
        forbid=tuple(spec.get("forbid", ())),
        must_commit=bool(spec.get("must_commit", True)),
        read_only=bool(spec.get("read_only", False)),
        git_allow=tuple(spec.get("git_allow", ())),
        limits=Limits(**spec.get("limits", {})),
        output=spec.get("output"),
        snapshot_every=int(spec.get("snapshot_every", 10)),
        ci_files=str(spec.get("ci_files", "fail")),
        run_files=spec.get("run_files"),
        setup=tuple(spec.get("setup", ())),
        setup_timeout=int(spec.get("setup_timeout", 600)),
        sources=tuple(sorted(origin.get(name, {}).items())),
    )


def policy_table(data: bytes | None) -> object:
    """pyproject.toml's [tool.ccm-guard] table as data (None when absent), to compare two
    versions; a file that does not parse is its own value, so any edit of it shows."""
    if data is None:
        return None
    import tomllib

    try:
        parsed: Any = tomllib.loads(data.decode("utf-8", "replace"))
    except tomllib.TOMLDecodeError:
        return ("unparseable", data)
    tool = parsed.get("tool")
    return tool.get("ccm-guard") if isinstance(tool, dict) else None


POLICY_LIMIT = 1 << 20  # bytes; a policy is a page or two of TOML


def read_file(path: Path) -> Source:
    """A policy file the person named: a regular file (a link to one is fine) of bounded
    size; a FIFO, a device (`--policy /dev/zero`) or a huge file is refused, not read."""
    try:
        with open_regular(path, follow_links=True) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > POLICY_LIMIT:
                raise PolicyError(f"policy file {path} is {size} bytes, over the {POLICY_LIMIT} allowed: "
                                  "pass the policy itself")
            text = fh.read(POLICY_LIMIT).decode("utf-8", "replace")
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise PolicyError(f"policy file {path} is not a regular file: pass a .toml file") from exc
        raise PolicyError(f"cannot read policy file {path}: {exc.strerror}; check the path") from exc
    table = ("tool", "ccm-guard") if path.name == "pyproject.toml" else ()
    return Source(str(path), text, table)


# The files that hold a repository's policy; pyproject first, so that a dedicated
# .ccm-guard.toml has the last word.
COMMITTED_FILES = (POLICY_TABLE_FILE, POLICY_FILE)


def load(rev: str | None, committed: Mapping[str, bytes | None], override: Path | None) -> Policy:
    """The effective policy: built-ins, the user's default, the repository's files as
    committed at `rev` (`committed`: COMMITTED_FILES read by the caller, who runs git), --policy."""
    sources = []
    user = home() / "policy.toml"
    if user.exists():
        sources.append(read_file(user))
    for path, table in ((POLICY_TABLE_FILE, ("tool", "ccm-guard")), (POLICY_FILE, ())):
        data = committed.get(path)
        if data is not None:
            sources.append(Source(f"{(rev or '')[:12]}:{path}", data.decode("utf-8", "replace"), table))
    if override is not None:
        sources.append(read_file(override))
    return build(sources)


def describe(role: Role) -> dict[str, object]:
    """A role as data, each value with where it came from (for `policy show`)."""
    values: dict[str, object] = {
        "allow": list(role.allow) if role.allow is not None else "(everything not forbidden)",
        "forbid": list(role.forbid), "must_commit": role.must_commit, "read_only": role.read_only,
        "git_allow": list(role.git_allow), "output": role.output, "snapshot_every": role.snapshot_every,
        "ci_files": role.ci_files, "run_files": role.run_files_severity, "setup": list(role.setup), "setup_timeout": role.setup_timeout,
    }
    for f in dataclasses.fields(Limits):
        values[f"limits.{f.name}"] = getattr(role.limits, f.name)
    return {key: {"value": value, "from": role.source_of(key)} for key, value in values.items()}
