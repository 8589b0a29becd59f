"""Reading a git index file directly: how many files, how many bytes.

Used only to estimate what a checkout will write (the disk-space preflight): asking git
for every blob's size opens every object (1.5 s at 100k files here), while the person's
index already records each file's size (about 50 ms to read).
"""

from __future__ import annotations

import struct
from pathlib import Path


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
