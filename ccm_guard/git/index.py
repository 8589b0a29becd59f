"""The index: reading an index file directly (how many files, how many bytes), and the
git calls that read or write an index, the work tree's own or a private index file.

`sizes` is used only to estimate what a checkout will write (the disk-space preflight):
asking git for every blob's size opens every object (1.5 s at 100k files here), while
the person's index already records each file's size (about 50 ms to read).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Sequence

from ccm_guard.git.core import Repo, run


def sizes(path: Path, oid_len: int = 20) -> tuple[int, int] | None:
    """(entries, total size) recorded in an index file, or None if it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if len(data) < 12 or data[:4] != b"DIRC":
        return None
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        return None
    pos, total, fixed = 12, 0, 40 + oid_len + 2
    try:
        for _ in range(count):
            total += struct.unpack_from(">I", data, pos + 36)[0]
            flags = struct.unpack_from(">H", data, pos + 40 + oid_len)[0]
            head = fixed + (2 if version >= 3 and flags & 0x4000 else 0)
            if version == 4:
                pos += head
                while data[pos] & 0x80:  # the varint of the prefix to strip from the last path
                    pos += 1
                pos = data.index(b"\0", pos + 1) + 1
            else:
                end = data.index(b"\0", pos + head)
                pos += (end - pos + 8) & ~7
    except (struct.error, ValueError, IndexError):
        return None
    return count, total


def reset_index(repo: Repo, rev: str) -> None:
    """The work tree's own index to `rev`, its files untouched (`git reset --mixed`)."""
    run(["read-tree", "--reset", rev], repo)


def index_tree(repo: Repo, index: Path) -> str | None:
    """The tree an index file describes (what was staged there), or None when git cannot
    write one from it (unmerged entries, missing objects, not an index at all)."""
    res = run(["write-tree"], repo, env={"GIT_INDEX_FILE": str(index)}, check=False)
    return res.out.strip() if res.returncode == 0 else None


# A private index over a work tree (recovery commits on the agent's behalf with one, so the
# agent's staging plays no part). Unlike the pool's (checkout.py), it keeps the task's own
# sparse settings.


def index_from(repo: Repo, index: Path, rev: str) -> None:
    """Make the index file `index` hold exactly `rev`'s tree (its stat cache kept, if any)."""
    run(["read-tree", "--reset", rev], repo, env={"GIT_INDEX_FILE": str(index)})


def changed_with_index(repo: Repo, index: Path) -> list[str]:
    """Paths whose work-tree state differs from HEAD in the index file `index`, plus
    untracked files that are not ignored."""
    env = {"GIT_INDEX_FILE": str(index)}
    # Refresh first: diff-index reports every entry whose stat data is stale as changed.
    run(["update-index", "-q", "--refresh", "--ignore-submodules"], repo, env=env, check=False)
    tracked = run(["diff-index", "-z", "--name-only", "--no-renames", "HEAD", "--"], repo, env=env).z()
    untracked = run(["ls-files", "-z", "--others", "--exclude-standard", "--"], repo, env=env).z()
    # A nested repository is listed as "dir/"; update-index wants the path without it.
    return sorted(set(tracked) | {p.rstrip("/") for p in untracked})


def stage_with_index(repo: Repo, index: Path, paths: Sequence[str]) -> str:
    """Record the work tree's state of `paths` in the index file `index`; its tree id.
    update-index takes the paths literally from stdin (no pathspec magic, no argv limit),
    --add for new files, --remove for deleted ones."""
    env = {"GIT_INDEX_FILE": str(index)}
    data = b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)
    run(["update-index", "--add", "--remove", "-z", "--stdin"], repo, env=env, input=data)
    return run(["write-tree"], repo, env=env).out.strip()
