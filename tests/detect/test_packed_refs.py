"""packed-refs read fast (a few C-speed passes) gives exactly what the strict reading
gives, for files git writes and for the malformed ones the strict reading reports."""

from __future__ import annotations

import random

import pytest

from ccm_guard.detect.snapshot import _packed_refs, _packed_refs_strictly

A, B, C = "a" * 40, "b" * 40, "c" * 64
HEADER = b"# pack-refs with: peeled fully-peeled sorted \n"

CASES = [
    b"",
    HEADER,
    HEADER + f"{A} refs/heads/main\n".encode(),
    HEADER + f"{A} refs/heads/main\n^{B}\n{B} refs/tags/v1\n".encode(),
    f"{A} refs/heads/a\n{B} refs/heads/b".encode(),  # no final newline, no header
    f"{C} refs/heads/sha256\n".encode(),
    f"{A} refs/heads/with space\n{A} refs/heads/with\rcr\n".encode(),
    f"{A} refs/heads/b\n{A} refs/heads/a\n".encode(),  # out of order
    f"{A} refs/heads/a\n{B} refs/heads/a\n".encode(),  # twice
    f"^{B}\n{A} refs/heads/a\n".encode(),  # peeled before any record
    HEADER + HEADER + f"{A} refs/heads/a\n".encode(),  # a second header
    f"{A} refs/heads/a\n\n{B} refs/heads/b\n".encode(),  # a blank line
    f"{A.upper()} refs/heads/a\n".encode(),  # not git's spelling of an id
    f"{A} heads/a\n".encode(),  # not under refs/
    f"{A}  refs/heads/a\n".encode(),  # two spaces
    f"# a comment\n{A} refs/heads/a\n".encode(),
    f"{A} refs/heads/\xe9t\xe9\n".encode() + b"ff" * 20 + b" refs/heads/\xff\n",  # bytes that are not UTF-8
    # In byte order, not in text order: U+10000 (F0 90 80 80) sorts before a raw F5 byte,
    # whose escape (U+DCF5) sorts before it as text.
    f"{A} refs/heads/\U00010000\n".encode() + f"{B} refs/heads/".encode() + b"\xf5\n",
    f"{B} refs/heads/".encode() + b"\xf5\n" + f"{A} refs/heads/\U00010000\n".encode(),
]


@pytest.mark.parametrize("data", CASES)
def test_fast_and_strict_readings_agree(data: bytes) -> None:
    assert _packed_refs(data) == _packed_refs_strictly(data)


def test_they_agree_on_many_generated_files() -> None:
    rng = random.Random(7)
    for _ in range(300):
        names = sorted({f"refs/{rng.choice(['heads', 'tags', 'remotes/o'])}/{rng.randrange(10**6)}"
                        for _ in range(rng.randrange(0, 30))})
        lines = [HEADER] if rng.random() < 0.8 else []
        for name in names:
            lines.append(f"{rng.choice([A, B, C])} {name}\n".encode())
            if rng.random() < 0.2:
                lines.append(f"^{rng.choice([A, B])}\n".encode())
        if lines and rng.random() < 0.3:  # one line spoiled
            i = rng.randrange(len(lines))
            lines[i] = rng.choice([b"\n", b"junk\n", lines[i][::-1], lines[i] * 2])
        data = b"".join(lines)
        assert _packed_refs(data) == _packed_refs_strictly(data), data


def test_peeled_values_are_kept_and_a_stray_one_is_malformed() -> None:
    assert _packed_refs(HEADER + f"{A} refs/tags/v1\n^{B}\n".encode()) == {"refs/tags/v1": A, "refs/tags/v1^{}": B}
    for stray in (f"{A} refs/tags/v1\n^{B}\n^{B}\n", f"{A} refs/tags/v1\n^{B}\n^{A}\n{B} refs/tags/v2\n"):
        assert "malformed" in _packed_refs(stray.encode()).get("packed-refs", ""), stray  # git dies on it
