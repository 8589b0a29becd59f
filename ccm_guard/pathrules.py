"""Gitignore-style path patterns, matched fast and without being fooled by spelling.

pathspec gives git's semantics. Its default backend costs about 4 µs a path for 21
patterns (PERF-NOTES); with google-re2 installed (a dependency, with wheels for x86_64
and aarch64) it is about 1.5 µs for 33, so that is used when present.
"""

from __future__ import annotations

import functools
import importlib.util
import unicodedata

import pathspec


@functools.lru_cache(maxsize=1)
def _backend() -> str:
    return "re2" if importlib.util.find_spec("re2") else "simple"


class Matcher:
    def __init__(self, patterns: list[str] | tuple[str, ...]) -> None:
        self.patterns = tuple(patterns)
        try:
            self.spec = pathspec.GitIgnoreSpec.from_lines(self.patterns, backend=_backend())
        except (ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from exc
        if not self.spec.patterns and any(p.strip() and not p.lstrip().startswith("#") for p in self.patterns):
            raise ValueError("no usable pattern")

    def matches(self, path: str) -> bool:
        if not self.patterns:
            return False
        if not path.isascii() and not _is_utf8(path):
            # A name that is not UTF-8 (kept by git as surrogate escapes) is beyond re2:
            # the pure-Python backend matches the same rules.
            return self._exact().match_file(path)
        return self.spec.match_file(path)

    @functools.cache
    def _exact(self) -> pathspec.GitIgnoreSpec:
        return pathspec.GitIgnoreSpec.from_lines(self.patterns, backend="simple")

    def rule_for(self, path: str) -> str | None:
        """The pattern that decides `path`, for messages (the last one matching, as in git)."""
        if not self.matches(path):
            return None
        decided = None
        for line, compiled in zip(self.patterns, self.spec.patterns):
            if compiled.include is not None and compiled.match_file(path) is not None:
                decided = line
        return decided


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def spellings(path: str) -> list[str]:
    """The names a path may also have on disk, case-folded: both Unicode normal forms.

    macOS and Windows file systems treat these as one file (and ignore case), so a rule
    forbidding one spelling must catch them all. Matching folded names against folded
    patterns is stricter than git on Linux, never looser.
    """
    folded = path.casefold()
    if folded.isascii():
        return [folded]
    return sorted({unicodedata.normalize(form, folded) for form in ("NFC", "NFD")})


class Rules:
    """A role's allow and forbid lists together."""

    def __init__(self, allow: tuple[str, ...] | None, forbid: tuple[str, ...]) -> None:
        self.allow = Matcher(allow) if allow is not None else None
        self.forbid = Matcher(forbid)
        self.forbid_folded = Matcher([p.casefold() for p in forbid])

    def violation(self, path: str) -> str | None:
        """Why `path` may not be changed, or None when it may."""
        for name in spellings(path):
            if self.forbid_folded.matches(name):
                rule = self.forbid.rule_for(path) or self.forbid_folded.rule_for(name)
                shown = "" if self.forbid.matches(path) else f" (as {name!r}, the same file on some systems)"
                return f"forbidden by {rule!r}{shown}"
        if self.allow is not None and not self.allow.matches(path):
            return "not in the role's allow list" if self.allow.patterns else "the role may change no files"
        return None
