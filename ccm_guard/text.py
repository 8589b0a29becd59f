"""Showing text the agent chose (paths, subjects, questions) on a terminal without letting it
hide or reorder anything."""

from __future__ import annotations

import re

MAX_PATHS = 20  # paths shown per finding in a human verdict; --json has them all

# Control characters (C0, DEL, C1) and bidirectional overrides can hide or reorder text
# on a terminal; anything the agent chose (paths, commit subjects) is shown escaped.
_C1_AND_BIDI = "\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_UNSAFE = re.compile(f"[\x00-\x1f{_C1_AND_BIDI}]")


def safe(text: str) -> str:
    return _UNSAFE.sub(_escaped, text)


_UNSAFE_IN_LINES = re.compile(f"[\x00-\x08\x0b-\x1f{_C1_AND_BIDI}]")  # all but tab and newline


def safe_lines(text: str) -> str:
    """`safe` for text shown as lines (a diff): newlines and tabs stay as they are."""
    return _UNSAFE_IN_LINES.sub(_escaped, text)


def first_few(items: list[str], few: int = 5) -> str:
    """`a, b, c and 4 more`: a list named in one line of a message."""
    return ", ".join(items[:few]) + (f" and {len(items) - few} more" if len(items) > few else "")


def _escaped(match: re.Match[str]) -> str:
    char = ord(match.group())
    return f"\\x{char:02x}" if char < 0x100 else f"\\u{char:04x}"


def human_age(seconds: float) -> str:
    """An age the way people say it: 40s, 12m, 3h, 9d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"
