"""Gitignore-style path patterns, matched fast and without being fooled by spelling.

pathspec translates each pattern into a regular expression; matching is done here, by
git's own rules (checked against `git check-ignore`). Many paths at once (a gate, a
check of a range) are matched in one scan of them all; forbid rules use google-re2 for
that scan when it is installed (a dependency, with wheels for x86_64 and aarch64).
"""

from __future__ import annotations

import functools
import importlib.util
import re
import unicodedata
from typing import Any


@functools.lru_cache(maxsize=1)
def _backend() -> str:
    return "re2" if importlib.util.find_spec("re2") else "simple"


Compiled = list[tuple[str | None, bool | None]]  # per pattern line: pathspec's expression, include


def _compile(patterns: tuple[str, ...]) -> Compiled:
    """pathspec's translation of gitignore patterns into regular expressions (the only
    use of pathspec, which costs ~35 ms to import: hooks get the result ready-made)."""
    import pathspec

    try:
        spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from exc
    if not spec.patterns and any(not p.lstrip().startswith("#") for p in patterns):
        raise ValueError("no usable pattern")
    return [(p.regex.pattern if p.regex is not None else None, p.include) for p in spec.patterns]


class Matcher:
    def __init__(self, patterns: list[str] | tuple[str, ...], rare: bool = False,
                 compiled: Compiled | None = None) -> None:
        # Blank lines yield no pattern in pathspec; dropping them keeps lines and
        # expressions side by side.
        self.patterns = tuple(p for p in patterns if p.strip())
        self.compiled = compiled if compiled is not None else _compile(self.patterns)
        self._rules = [
            (line, re.compile(expr), bool(include), line.rstrip().endswith("/"))
            for line, (expr, include) in zip(self.patterns, self.compiled)
            if expr is not None and include is not None
        ]
        self._negated = any(not include for _, _, include, _ in self._rules)
        self._rare = rare

    def to_data(self) -> dict[str, object]:
        return {"patterns": list(self.patterns), "compiled": self.compiled}

    @classmethod
    def from_data(cls, data: dict[str, Any], rare: bool = False) -> "Matcher":
        return cls(data["patterns"], rare, [(e, i) for e, i in data["compiled"]])

    def matches(self, path: str) -> bool:
        if self._negated:
            return self._decide_like_git(path)
        return any(regex.search(path) for _, regex, _, _ in self._rules)

    def matching(self, paths: list[str]) -> set[str]:
        """The paths this matches, many at once: one scan of them all joined by newlines.

        One by one, even re2 costs about 1.5 µs a path; one scan of the joined text is C
        all the way. Names with a newline or that are not UTF-8 take the one-by-one road.
        """
        if not self._rules:
            return set()
        if self._negated or len(paths) < 64:  # few paths (a hook): not worth compiling a scanner
            return {p for p in paths if self.matches(p)}
        plain = [p for p in paths if "\n" not in p and (p.isascii() or _is_utf8(p))]
        odd = set(paths).difference(plain)
        return set(self._scanner().findall("\n".join(plain))) | {p for p in odd if self.matches(p)}

    @functools.cache
    def _scanner(self) -> "re.Pattern[str]":
        # re2 scans text that rarely matches (forbid rules) fastest; Python's re is
        # faster when most lines match (allow rules): re2's binding pays per match.
        return _line_scanner([r.pattern for _, r, _, _ in self._rules], self._rare)

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
        for _, regex, include, dir_only in self._rules:
            if (not dir_only or is_dir) and _names(regex, name, dir_only):
                decided = include
        return decided

    def rule_for(self, path: str) -> str | None:
        """The pattern that decides `path`, for messages (the last one matching, as in git)."""
        if not self.matches(path):
            return None
        decided = None
        for line, regex, include, _ in self._rules:
            if include and regex.search(path) is not None:
                decided = line
        return decided or next((line for line, _, include, _ in self._rules if include), None)


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


def _line_scanner(expressions: list[str], rare: bool) -> "re.Pattern[str]":
    """One expression that finds, in paths joined by newlines, every line one of
    pathspec's expressions matches (as `search` would, anywhere in the path)."""
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

    def __init__(self, allow: tuple[str, ...] | None, forbid: tuple[str, ...],
                 ready: dict[str, Any] | None = None) -> None:
        if ready is not None:  # compiled earlier (to_data): no pathspec needed
            self.allow = Matcher.from_data(ready["allow"]) if ready["allow"] is not None else None
            self.forbid = Matcher.from_data(ready["forbid"], rare=True)
            self.forbid_folded = Matcher.from_data(ready["forbid_folded"], rare=True)
            return
        self.allow = Matcher(allow) if allow is not None else None
        self.forbid = Matcher(forbid, rare=True)
        self.forbid_folded = Matcher([p.casefold() for p in forbid], rare=True)

    def to_data(self) -> dict[str, Any]:
        return {"allow": self.allow.to_data() if self.allow else None, "forbid": self.forbid.to_data(),
                "forbid_folded": self.forbid_folded.to_data()}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Rules":
        return cls(None, (), data)

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
