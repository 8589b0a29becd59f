"""Sparse checkouts in cone mode: a task that sees only some directories, and a role whose
path rules forbid everything outside them."""

from __future__ import annotations

import dataclasses

from ccm_guard import git
from ccm_guard.errors import UsageError
from ccm_guard.policy import Role


def normalise_cone(paths: tuple[str, ...] | list[str]) -> list[str]:
    """`--sparse` directories as cone mode names them: relative, no `.`/`..`, no slashes
    at either end. A bad one is a usage error."""
    cone = []
    for raw in paths:
        path = raw.strip().removeprefix("./").strip("/")
        parts = path.split("/")
        if not path or raw.startswith("/") or "\n" in path or any(part in ("", ".", "..") for part in parts) \
                or parts[0] == ".git":
            raise UsageError(f"--sparse {raw!r}: name a directory relative to the repository's top, like src/lib")
        cone.append(path)
    return sorted(set(cone))


def sparse_cone(host: git.Repo, base: str, paths: tuple[str, ...], pool: bool | None) -> list[str]:
    """The checked cone for `--sparse`: every name a directory at the task's base."""
    if not paths:
        return []
    if pool is True:
        raise UsageError("--pool and --sparse do not mix: a pooled worktree has every file checked out; drop --pool")
    cone = normalise_cone(paths)
    for path in cone:
        kind = git.object_type(host, base, path)
        if kind != "tree":
            what = "does not exist" if kind is None else f"is a {kind}, not a directory"
            raise UsageError(f"--sparse {path!r} {what} at {base[:12]}: cone mode checks out whole directories; "
                             "name one that exists there")
    return cone


def cone_forbid(cone: list[str]) -> tuple[str, ...]:
    """Forbid rules (gitignore-style) for what a cone-mode sparse checkout leaves out: every
    directory but the cone's, and but their parents (whose own files git checks out).
    Added to the role's forbid list, they make a change outside the cone a path-policy
    failure, committed or not (an untracked one fails clean-tree as well)."""
    if not cone:
        return ()
    parents = sorted({"/".join(c.split("/")[:i]) for c in cone for i in range(1, c.count("/") + 1)},
                     key=lambda d: (d.count("/"), d))
    inside = [d for d in cone if not any(d.startswith(o + "/") for o in cone)]
    rules = ["/*/"]
    for parent in parents:
        if not any(parent == d or parent.startswith(d + "/") for d in inside):
            rules += [f"!/{parent}/", f"/{parent}/*/"]
    return (*rules, *(f"!/{d}/" for d in inside))


def in_cone(path: str, cone: list[str]) -> bool:
    """Whether cone mode checks `path` out: a file at the top, under a cone directory, or
    directly in a parent of one."""
    parent = path.rpartition("/")[0]
    return not parent or any(path.startswith(d + "/") or d.startswith(parent + "/") for d in cone)


def sparse_role(role: Role, paths: tuple[str, ...]) -> Role:
    """The role with everything outside the `--sparse` cone forbidden."""
    if not paths:
        return role
    return dataclasses.replace(role, forbid=(*role.forbid, *cone_forbid(normalise_cone(paths))))
