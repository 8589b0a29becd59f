"""The object store: an inventory before and after, and a check that nothing old changed.

A run may add objects; it must never change or remove existing ones (an overwritten
loose object or a forged pack rewrites history under everybody's feet). Git itself
"freshens" an object it would write again by touching its mtime, so a changed identity
alone is not a finding: the file's content is then verified against the name it carries
(a loose object is named by the hash of its inflated bytes, a pack by the checksum its
bytes end in). An index is named after its pack, not its own bytes: git verifies one
that changed against the pack, object by object.
"""

from __future__ import annotations

import dataclasses
import os
import zlib
from pathlib import Path
from typing import Callable, Iterator

from ccm_guard.digest import hasher
from ccm_guard.files import open_regular, read_regular

Identity = tuple[int, int, int, int]  # inode, size, mtime_ns, ctime_ns

_HEX = set("0123456789abcdef")
# Git reads every pack index in objects/pack whatever its name: a "tmp_" prefix proves nothing.
_READ_BY_GIT = (".idx", ".pack", ".rev", ".bitmap", ".midx", "multi-pack-index")


def inventory(objects_dir: Path) -> dict[str, Identity]:
    """Loose objects and pack files by relative path (objects/info is hashed elsewhere)."""
    found: dict[str, Identity] = {}
    try:
        top = list(os.scandir(objects_dir))
    except (FileNotFoundError, NotADirectoryError):
        return found
    for dent in top:
        if not dent.is_dir(follow_symlinks=False) or not (_is_fanout(dent.name) or dent.name == "pack"):
            continue
        try:
            listed = list(os.scandir(dent.path))
        except FileNotFoundError:
            continue  # an emptied fanout directory pruned meanwhile
        for obj in listed:
            if obj.name.startswith("tmp_") and not obj.name.endswith(_READ_BY_GIT):
                continue  # git's own write in progress (tmp_obj_*, tmp_pack_*): git never reads it
            try:
                st = obj.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # pruned or repacked meanwhile (a gc of the person's)
            found[f"{dent.name}/{obj.name}"] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return found


def _is_fanout(name: str) -> bool:
    return len(name) == 2 and set(name) <= _HEX


@dataclasses.dataclass
class ObjectDelta:
    """What changed in the object store between two snapshots."""

    added: int
    removed: list[str]
    altered: list[str]  # existing objects whose content no longer matches their name
    # Loose objects that left for a pack that appeared in the same run (a `git gc --auto`
    # of the person's can run at any time), and the new packs that claim to hold them.
    repacked: list[str] = dataclasses.field(default_factory=list)
    new_packs: list[str] = dataclasses.field(default_factory=list)
    # New loose objects whose inflated bytes do not hash to their name: git reads an
    # object by its id from wherever it finds it, so such a file can stand in for an
    # existing object (main:src/calc.py with other bytes). New packs are verified by git.
    forged: list[str] = dataclasses.field(default_factory=list)
    midx_changed: bool = False  # a multi-pack index maps ids to pack offsets: git verifies a new one
    # New files beside a pack (or multi-pack index) from before the run: a .bitmap or .rev
    # git trusts to list or find its objects (a forged bitmap drops objects from every push,
    # clone and bundle), a .keep or .promisor that changes what gc does with it.
    beside_old: list[str] = dataclasses.field(default_factory=list)
    # New reachability bitmaps, beside a new pack or multi-pack index too: git trusts one to
    # list what a push, clone or bundle sends, nothing verifies it, and no agent needs one.
    bitmaps: list[str] = dataclasses.field(default_factory=list)


def compare(objects_dir: Path, before: dict[str, Identity], after: dict[str, Identity]) -> ObjectDelta:
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    altered = [
        rel
        for rel, ident in before.items()
        if rel in after and after[rel] != ident
        and not verify(objects_dir / rel, before_size=ident[1], kept=lambda r: r in before and after.get(r) == before[r])
    ]
    new_packs = [rel for rel in new if rel.startswith("pack/") and rel.endswith(".idx")]
    loose = [rel for rel in gone if _is_fanout(rel[:2])]
    packed: set[str] = set()
    for rel in new_packs if loose else []:
        packed |= pack_names(objects_dir / rel, len(loose[0].replace("/", "")) // 2)
    repacked = [rel for rel in loose if rel.replace("/", "") in packed]
    removed = [rel for rel in gone if rel not in repacked]
    forged = [rel for rel in new if _is_fanout(rel[:2]) and _forged_loose(objects_dir / rel)]
    midx = "pack/multi-pack-index"
    midx_changed = midx in after and before.get(midx) != after[midx]
    beside_old = _beside_old(before, new, midx_kept=midx in before and not midx_changed)
    return ObjectDelta(len(new), removed, sorted(altered), repacked, new_packs, forged, midx_changed=midx_changed,
                       beside_old=beside_old,
                       bitmaps=[rel for rel in new if rel.startswith("pack/") and rel.endswith(".bitmap")
                                and rel not in beside_old])


def _beside_old(before: dict[str, Identity], new: list[str], *, midx_kept: bool) -> list[str]:
    """New files in objects/pack that belong to a pack (pack-<hash>.*) or the multi-pack index
    (multi-pack-index-<hash>.*) that were there before the run."""
    found = []
    for rel in new:
        if not rel.startswith("pack/"):
            continue
        stem = rel[len("pack/"):].partition(".")[0]
        if stem.startswith("pack-") and (f"pack/{stem}.pack" in before or f"pack/{stem}.idx" in before):
            found.append(rel)
        elif stem.startswith("multi-pack-index") and midx_kept:
            found.append(rel)
    return found


def forged_since(objects_dir: Path, since: float, object_format: str = "sha1") -> list[str]:
    """Object files written at or after `since` (seconds) that do not hold what their names
    say: loose objects re-hashed; a pack of which only the .pack was written (git's
    freshening sets its times whenever a commit writes an object it holds) hashed against
    its name and the index made for it; a written .pack must hold its name, and a pack with
    any other file written (a pack rewritten in place keeps its old index), and a
    multi-pack index, are verified by git."""
    from ccm_guard import git

    threshold = int((since - 1) * 1e9)  # a second's slack, as file times are coarse somewhere
    found: list[str] = []
    packs: dict[str, set[str]] = {}  # pack/pack-<name> -> the suffixes written
    for rel, (_, _, _, ctime_ns) in sorted(inventory(objects_dir).items()):
        if ctime_ns < threshold:
            continue
        if _is_fanout(rel[:2]):
            if _forged_loose(objects_dir / rel):
                found.append(rel)
        elif rel.startswith("pack/multi-pack-index"):
            packs["pack/multi-pack-index"] = set()
        elif rel.startswith("pack/pack-"):
            stem, _, suffix = rel.rpartition(".")
            packs.setdefault(stem, set()).add(suffix)
    for stem, written in sorted(packs.items()):
        if stem == "pack/multi-pack-index":
            if not git.verify_midx(objects_dir, object_format):
                found.append(stem)
            continue
        pack, idx = objects_dir / f"{stem}.pack", objects_dir / f"{stem}.idx"
        # A pack not written since is as trusted as before; one written is the one git
        # wrote only if it holds its name (verify-pack passes any pair that agree).
        authentic = "pack" not in written or holds_its_name(pack)
        if written == {"pack"} and authentic and _made_for(idx, pack):
            continue  # freshened: no object of it needs looking at
        if not (authentic or "idx" not in written) or (os.path.lexists(idx) and not git.verify_pack(idx, object_format)):
            found.append(f"{stem}.idx")
    return found


def holds_its_name(pack: Path) -> bool:
    """Whether a .pack's bytes hash to its trailer and the trailer is its name, as git names
    every pack it writes: then the bytes are those it was written with (only a hash
    collision says otherwise). Hashed a piece at a time: a pack can be gigabytes."""
    name = pack.name.removeprefix("pack-").removesuffix(".pack")
    if len(name) not in (40, 64) or not set(name) <= _HEX:
        return False
    size = len(name) // 2
    try:
        with open_regular(pack) as fh:
            left = os.fstat(fh.fileno()).st_size - size
            digest = hasher("sha1" if size == 20 else "sha256", max(left, 0))
            while left > 0 and (chunk := fh.read(min(left, 1 << 20))):
                digest.update(chunk)
                left -= len(chunk)
            trailer = fh.read(size + 1)
    except OSError:
        return False
    return left == 0 and digest.digest() == trailer == bytes.fromhex(name)


def _made_for(idx: Path, pack: Path) -> bool:
    """Whether the index records the pack's name as the checksum of the pack it was made for."""
    size = (len(pack.name) - len("pack-.pack")) // 2
    recorded = read_regular(idx, 2 * size, tail=True)
    return recorded is not None and len(recorded) == 2 * size and recorded[:size].hex() == pack.name[5:-5]


def _forged_loose(path: Path) -> bool:
    """A loose object whose bytes do not hash to its name. (One that is gone again was
    pruned by a git of the person's meanwhile: not a forgery.)"""
    return not _loose_ok(path) and os.path.lexists(path)


def pack_names(idx: Path, oid_len: int) -> set[str]:
    """The object names a version-2 pack index lists (empty if it is anything else)."""
    try:
        data = _read(idx)
    except OSError:
        return set()
    if data[:8] != b"\xfftOc\0\0\0\x02" or len(data) < 8 + 1024:
        return set()
    count = int.from_bytes(data[8 + 255 * 4: 8 + 256 * 4], "big")
    start = 8 + 1024
    return {data[start + i * oid_len: start + (i + 1) * oid_len].hex() for i in range(count)}


def verify(path: Path, before_size: int, kept: Callable[[str], bool]) -> bool:
    """True when the file still holds exactly what its name promises. `kept(rel)`: whether
    another object file (pack/<name>) is as it was, identity and all."""
    if path.parent.name == "pack":
        return _pack_file_ok(path, before_size, kept)
    try:
        data = _read(path)
    except OSError:
        return False
    return len(data) == before_size and _loose_ok(path, data)


def _pack_file_ok(path: Path, before_size: int, kept: Callable[[str], bool]) -> bool:
    """A pack file from before the run whose identity changed, and so maybe its bytes.

    Git's freshening sets a .pack's times and nothing else, and git names a pack after the
    checksum its bytes end in: a .pack of the same size that still hashes to its name is
    the one git wrote. Otherwise only git's check against the pack's unchanged index
    vouches for it (a pack named the old way, by git before 1.8.5): `git verify-pack`
    alone passes any pack and index that agree with each other, the person's objects
    left out. An index is named after its pack, not its own bytes: a changed one passes
    only beside a pack that is the one git wrote, and git then verifies every object it
    maps."""
    from ccm_guard import git

    stem, _, suffix = path.name.rpartition(".")
    try:
        if os.lstat(path).st_size != before_size or suffix not in ("pack", "idx"):
            return False  # .keep, .rev, .bitmap ... are not rewritten by a normal run
    except OSError:
        return False
    pack, idx = path.with_name(f"{stem}.pack"), path.with_name(f"{stem}.idx")
    if suffix == "pack" and holds_its_name(pack):
        return True
    other = idx if suffix == "pack" else pack
    if not (kept(f"pack/{other.name}") or (suffix == "idx" and holds_its_name(pack))):
        return False
    return os.path.lexists(idx) and git.verify_pack(idx, "sha256" if len(stem) == len("pack-") + 64 else "sha1")


_CHUNK = 1 << 16


def _loose_ok(path: Path, data: bytes | None = None) -> bool:
    """Whether a loose object's inflated bytes hash to the name it is stored under.

    Inflated and hashed a piece at a time, never past the size its header states: an
    agent's object may be a small file that inflates to gigabytes.
    """
    oid = path.parent.name + path.name
    if len(oid) not in (40, 64):
        return False
    try:
        stored = len(data) if data is not None else os.lstat(path).st_size  # deflated: a size hint only
    except OSError:
        return False
    digest = hasher("sha1" if len(oid) == 40 else "sha256", stored)
    inflate = zlib.decompressobj()
    head, expected, seen = b"", -1, 0
    try:
        for chunk in ([data] if data is not None else _chunks(path)):
            while chunk:
                out = inflate.decompress(chunk, _CHUNK)
                chunk = inflate.unconsumed_tail
                if expected < 0:
                    head += out[:64]
                    if b"\0" not in head:
                        if len(head) >= 64:
                            return False  # no header: not an object
                    else:
                        kind, _, size = head[:head.index(b"\0")].partition(b" ")
                        if not size.isdigit() or kind not in (b"blob", b"tree", b"commit", b"tag"):
                            return False
                        expected = head.index(b"\0") + 1 + int(size)
                seen += len(out)
                if expected >= 0 and seen > expected:
                    return False  # more than the header says: a forgery (or a bomb)
                digest.update(out)
    except (OSError, zlib.error):
        return False
    return inflate.eof and seen == expected and digest.hexdigest() == oid


def _read(path: Path) -> bytes:
    with open_regular(path) as fh:  # the agent can plant a link or a FIFO where objects are
        return fh.read()


def _chunks(path: Path) -> Iterator[bytes]:
    with open_regular(path) as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk
