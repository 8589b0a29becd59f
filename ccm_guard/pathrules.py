"""Gitignore-style path patterns, matched fast and without being fooled by spelling.

pathspec gives git's semantics. Its default backend costs about 4 µs a path for 21
patterns (PERF-NOTES); with google-re2 installed (a dependency, with wheels for x86_64
and aarch64) it is about 1.5 µs for 33, so that is used when present.
"""

from __future__ import annotations

import functools
import importlib.util
import re
import unicodedata

import pathspec


@functools.lru_cache(maxsize=1)
def _backend() -> str:
    return "re2" if importlib.util.find_spec("re2") else "simple"


class Matcher:
    def __init__(self, patterns: list[str] | tuple[str, ...], rare: bool = False) -> None:
        # Blank lines yield no pattern in pathspec; dropping them keeps lines and
        # compiled patterns side by side.
        self.patterns = tuple(p for p in patterns if p.strip())
        try:
            self.spec = pathspec.GitIgnoreSpec.from_lines(self.patterns, backend=_backend())
        except (ValueError, TypeError) as exc:
            raise ValueError(str(exc)) from exc
        if not self.spec.patterns and any(p.strip() and not p.lstrip().startswith("#") for p in self.patterns):
            raise ValueError("no usable pattern")
        self._negated = any(p.include is False for p in self.spec.patterns)
        # re2 scans text that rarely matches (forbid rules) fastest; Python's re is
        # faster when most lines match (allow rules): re2's binding pays per match.
        self._bulk = None if self._negated else _line_scanner(
            [p.regex.pattern for p in self.spec.patterns if p.include and p.regex is not None], rare)

    def matches(self, path: str) -> bool:
        if not self.patterns:
            return False
        if self._negated:
            return self._decide_like_git(path)
        # A name that is not UTF-8 (git keeps any bytes; Python holds them as surrogate
        # escapes) is beyond re2: the pure-Python backend matches the same rules.
        spec = self.spec if path.isascii() or _is_utf8(path) else self._exact()
        return spec.match_file(path)

    def matching(self, paths: list[str]) -> set[str]:
        """The paths this matches, many at once: one scan of them all joined by newlines.

        Per path, even re2 costs about 1.5 µs; one scan of the joined text is C all the
        way. Names with a newline or that are not UTF-8 take the one-by-one road.
        """
        if not self.patterns:
            return set()
        if self._bulk is None:
            return {p for p in paths if self.matches(p)}
        plain = [p for p in paths if "\n" not in p and (p.isascii() or _is_utf8(p))]
        odd = set(paths).difference(plain)
        return set(self._bulk.findall("\n".join(plain))) | {p for p in odd if self.matches(p)}

    @functools.cache
    def _exact(self) -> pathspec.GitIgnoreSpec:
        return pathspec.GitIgnoreSpec.from_lines(self.patterns, backend="simple")

    def _decide_like_git(self, path: str) -> bool:
        """git's own rule, needed once a pattern is negated: the last pattern naming a name
        decides, and a file cannot be re-included when a directory above it is excluded
        ("a" then "!b" still covers a/b)."""
        parts = path.split("/")
        if any(self._decide("/".join(parts[:i]), True) for i in range(1, len(parts))):
            return True
        return self._decide(path, False)

    def _decide(self, name: str, is_dir: bool) -> bool:
        decided = False
        for line, pattern in zip(self.patterns, self.spec.patterns):
            dir_only = line.rstrip().endswith("/")
            if pattern.include is None or pattern.regex is None or (dir_only and not is_dir):
                continue
            if _names(pattern.regex, name, dir_only):
                decided = pattern.include
        return decided

    def rule_for(self, path: str) -> str | None:
        """The pattern that decides `path`, for messages (the last one matching, as in git)."""
        if not self.matches(path):
            return None
        decided = None
        for line, compiled in zip(self.patterns, self.spec.patterns):
            if compiled.include and compiled.match_file(path) is not None:
                decided = line
        return decided or next(line for line, c in zip(self.patterns, self.spec.patterns) if c.include)


def _names(regex: re.Pattern[str], directory: str, dir_only: bool) -> bool:
    """Whether a pattern names `directory` itself, not only something above it.

    pathspec's expressions mark with the group ps_d the "/" after a name they match, so
    that a match also covers everything below it; such a match is about `directory`
    only when that "/" comes right after the whole of it.
    """
    # Some of pathspec's expressions are unanchored ("*/" is just "/"): try every match.
    for found in regex.finditer(directory + "/" if dir_only else directory):
        if "ps_d" not in regex.groupindex or found.group("ps_d") is None:
            return True
        if found.start("ps_d") == len(directory):
            return True
    return False


def _line_scanner(expressions: list[str], rare: bool) -> "re.Pattern[str] | None":
    """One expression that finds, in paths joined by newlines, every line one of
    pathspec's expressions matches (as `match` would, from the start of the path)."""
    if not expressions:
        return None
    alternatives = []
    for expr in expressions:
        expr = re.sub(r"\(\?P<[A-Za-z_]+>", "(?:", expr)
        expr = re.sub(r"(?<!\\)\[\^", "[^\\n", expr)  # a negated class must not cross lines
        expr = re.sub(r"(?<![\\\[])\.", "[^\\n]", expr)  # nor may "any character"
        alternatives.append(expr[1:] if expr.startswith("^") else "[^\n]*?" + expr)
    combined = "(?m)^((?:" + "|".join(f"(?:{a})" for a in alternatives) + ")[^\n]*)$"
    if rare and _backend() == "re2":
        import re2

        return re2.compile(combined)  # type: ignore[no-any-return]
    return re.compile(combined)


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
        self.forbid = Matcher(forbid, rare=True)
        self.forbid_folded = Matcher([p.casefold() for p in forbid], rare=True)

    def violations(self, paths: list[str]) -> dict[str, str]:
        """`violation` for many paths at once (the bulk scans); only offenders are returned."""
        folded: dict[str, list[str]] = {}
        for path in paths:
            if path.isascii():
                folded.setdefault(path.lower(), []).append(path)
        found: dict[str, str] = {}
        for name in self.forbid_folded.matching(list(folded)):
            for path in folded[name]:
                found[path] = self.violation(path) or "forbidden"
        if self.allow is not None:
            candidates = [p for p in paths if p.isascii() and p not in found]
            allowed = self.allow.matching(candidates)
            for path in candidates:
                if path not in allowed:
                    found[path] = self.violation(path) or "not allowed"
        for path in paths:
            if not path.isascii():
                why = self.violation(path)
                if why:
                    found[path] = why
        return found

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
