"""The object store: blobs and trees by id or by REV:PATH, hashing files as they are on
disk, and checking that packs and the commit-graph agree with what they describe."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from ccm_guard.git.base import batch_contents
from ccm_guard.git.core import Repo, run


def blob_at(repo: Repo, rev: str, path: str) -> str | None:
    res = run(["rev-parse", "--verify", "--quiet", f"{rev}:{path}"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def object_type(repo: Repo, rev: str, path: str) -> str | None:
    """"tree", "blob", "commit" (a gitlink) ... of `path` at `rev`, or None if it has none."""
    res = run(["cat-file", "-t", f"{rev}:{path}"], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def hash_file(repo: Repo, path: str) -> str | None:
    res = run(["hash-object", "--no-filters", "--", path], repo, check=False)
    return res.out.strip() if res.returncode == 0 else None


def hash_files(repo: Repo, paths: Sequence[Path]) -> list[str]:
    """The blob ids of files as they are on disk (no filters), in one git process."""
    if not paths:
        return []
    data = "".join(f"{p}\n" for p in paths).encode("utf-8", "surrogateescape")
    return run(["hash-object", "--no-filters", "--stdin-paths"], repo, input=data).out.split()


def blobs(repo: Repo, ids: list[str]) -> dict[str, bytes]:
    """The contents of blobs by id, in one `cat-file --batch`."""
    if not ids:
        return {}
    return batch_contents(run(["cat-file", "--batch"], repo, input="".join(f"{i}\n" for i in ids).encode()).stdout)


def blob_sizes(repo: Repo, ids: list[str]) -> dict[str, int]:
    if not ids:
        return {}
    out = run(["cat-file", "--batch-check=%(objectname) %(objectsize)"], repo,
              input="".join(f"{i}\n" for i in ids).encode()).out
    return {oid: int(size) for oid, _, size in (line.partition(" ") for line in out.splitlines()) if size.isdigit()}


def peeled(repo: Repo, ids: list[str]) -> dict[str, str]:
    """What each object peels to (a tag to what it tags, through tags of tags), read from
    the objects themselves, never from packed-refs' peeled lines."""
    if not ids:
        return {}
    out = run(["cat-file", "--batch-check=%(objectname)"], repo, input="".join(f"{i}^{{}}\n" for i in ids).encode()).out
    return {oid: line for oid, line in zip(ids, out.splitlines()) if not line.endswith(" missing")}


def file_at(repo: Repo, rev: str, path: str) -> bytes | None:
    """A file's content at a commit, or None if it has none there."""
    return files_at(repo, rev, [path])[path]


def files_at(repo: Repo, rev: str, paths: Sequence[str]) -> dict[str, bytes | None]:
    """Files' contents at a commit (None: no such file there), in one `cat-file --batch`
    of REV:PATH names."""
    if any("\n" in p for p in paths):  # the batch reads names by line
        return {p: (blobs(repo, [oid]).get(oid) if (oid := blob_at(repo, rev, p)) else None) for p in paths}
    names = "".join(f"{rev}:{p}\n" for p in paths).encode("utf-8", "surrogateescape")
    out = run(["cat-file", "--batch"], repo, input=names).stdout
    found: dict[str, bytes | None] = {}
    pos = 0
    for path in paths:
        header_end = out.index(b"\n", pos)
        header = out[pos:header_end].decode("utf-8", "surrogateescape")
        pos = header_end + 1
        if header.endswith((" missing", " ambiguous")):
            found[path] = None
            continue
        _, kind, size = header.rsplit(" ", 2)
        found[path] = out[pos:pos + int(size)] if kind == "blob" else None
        pos += int(size) + 1
    return found


def tree_of(repo: Repo, commit: str) -> str:
    return run(["rev-parse", f"{commit}^{{tree}}"], repo).out.strip()


def trees_of(repo: Repo, revs: Sequence[str]) -> list[str]:
    """The tree of each commit in `revs`, in one git process."""
    return run(["rev-parse", *(f"{rev}^{{tree}}" for rev in revs)], repo).out.split()


def tree_paths(repo: Repo, rev: str) -> list[str]:
    return run(["ls-tree", "-r", "-z", "--name-only", "--full-tree", rev], repo).z()


def tree_blobs(repo: Repo, rev: str) -> dict[str, tuple[str, str]]:
    """path -> (mode, object id) of every file in `rev`'s tree."""
    found = {}
    for record in run(["ls-tree", "-r", "-z", "--full-tree", rev], repo).z():
        meta, _, path = record.partition("\t")
        mode, _, oid = meta.split(" ")
        found[path] = (mode, oid)
    return found


def tree_size(repo: Repo, rev: str) -> tuple[int, int]:
    """(files, bytes) a checkout of `rev` writes; used for the disk-space preflight."""
    out = run(["ls-tree", "-r", "-z", "--format=%(objecttype) %(objectsize)", rev], repo).z()
    files = total = 0
    for record in out:
        kind, size = record.split(" ", 1)
        if kind == "blob":
            files += 1
            total += int(size)
    return files, total


def verify_commit_graph(repo: Repo) -> bool:
    """Whether the commit-graph agrees with the commits it describes (git checks each one)."""
    objects = repo.common_dir / "objects"
    return run(["commit-graph", "verify", "--object-dir", str(objects)], repo, check=False).returncode == 0


def verify_pack(idx: Path, object_format: str = "sha1") -> bool:
    """Whether a pack holds exactly the objects its index names (every object re-hashed).
    Run outside any repository (no config of the agent's is read); git then takes SHA-1,
    so a SHA-256 pack is verified from inside an empty repository of that format."""
    with _empty_repo(object_format) as repo:
        return run(["verify-pack", str(idx)], repo, check=False).returncode == 0


def verify_midx(objects_dir: Path, object_format: str = "sha1") -> bool:
    """Whether the multi-pack index names each object where its pack really holds it."""
    with _empty_repo(object_format) as repo:
        return run(["multi-pack-index", "--object-dir", str(objects_dir), "verify"], repo,
                   check=False).returncode == 0


@contextlib.contextmanager
def _empty_repo(object_format: str) -> Iterator[Repo | None]:
    """None for SHA-1 (git's default outside a repository); else a new empty bare
    repository of that object format, removed afterwards."""
    if object_format == "sha1":
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="ccm-guard-format-") as tmp:
        run(["init", "-q", "--bare", f"--object-format={object_format}", tmp])
        yield Repo(Path(tmp), Path(tmp), None)
