"""Gitignore-style path patterns, matched fast and by git's own rules.

pathspec translates each pattern into a regular expression; matching is done here, by
git's own rules (checked against `git check-ignore`). Many paths at once (a gate, a
check of a range) are joined into one text and scanned whole with google-re2 (a
dependency, with wheels for x86_64 and aarch64), which decides them all in C.
"""

from __future__ import annotations

import functools
import re

TYPE_CHECKING = False  # typing, importlib.util: not at import (the guard hooks load this per commit)
if TYPE_CHECKING:
    from typing import Any, Callable


@functools.lru_cache(maxsize=1)
def _backend() -> str:
    import importlib.util

    return "re2" if importlib.util.find_spec("re2") else "simple"


# Below _FEW paths (a hook's few staged files) one by one is cheaper than compiling a
# scanner. When not every line of a long text is matched, it is searched in chunks of
# _CHUNK lines, so that finding a few offenders costs a few chunks, not all of them.
_FEW, _CHUNK = 64, 1024

Compiled = list[tuple[str | None, bool | None]]  # per pattern line: pathspec's expression, include


# pathspec's translations of the built-in roles' patterns (and their case-folded forms),
# so that a run under a built-in role never imports pathspec (~13 ms of every start).
# tests/policy/test_matcher.py holds each equal to pathspec's own and prints the table
# anew when a pathspec release translates differently.
_DIR_OR_END = "(?:(?P<ps_d>/)|$)"
KNOWN: dict[str, str] = {
    "**/.git": r"^(?:.+/)?\.git" + _DIR_OR_END,
    "**/.gitattributes": r"^(?:.+/)?\.gitattributes" + _DIR_OR_END,
    "**/.gitmodules": r"^(?:.+/)?\.gitmodules" + _DIR_OR_END,
    "**/.gitignore": r"^(?:.+/)?\.gitignore" + _DIR_OR_END,
    "/.ccm-guard.toml": r"^\.ccm\-guard\.toml" + _DIR_OR_END,
    "tests/": r"^(?:.+/)?tests(?P<ps_d>/)",
    "test/": r"^(?:.+/)?test(?P<ps_d>/)",
    "spec/": r"^(?:.+/)?spec(?P<ps_d>/)",
    "specs/": r"^(?:.+/)?specs(?P<ps_d>/)",
    "__tests__/": r"^(?:.+/)?__tests__(?P<ps_d>/)",
    "test_*.py": r"^(?:.+/)?test_[^/]*\.py" + _DIR_OR_END,
    "*_test.*": r"^(?:.+/)?[^/]*_test\.[^/]*" + _DIR_OR_END,
    "*.test.*": r"^(?:.+/)?[^/]*\.test\.[^/]*" + _DIR_OR_END,
    "*.spec.*": r"^(?:.+/)?[^/]*\.spec\.[^/]*" + _DIR_OR_END,
}


def _compile(patterns: tuple[str, ...]) -> Compiled:
    """pathspec's translation of gitignore patterns into regular expressions (the only
    use of pathspec, which costs ~13 ms to import: built-in patterns are looked up in
    KNOWN, and hooks get the result ready-made)."""
    if all(p in KNOWN for p in patterns):
        return [(KNOWN[p], True) for p in patterns]
    return translate(patterns)


def translate(patterns: tuple[str, ...]) -> Compiled:
    """What pathspec makes of `patterns`, asked every time."""
    import pathspec

    try:
        spec = pathspec.GitIgnoreSpec.from_lines(patterns)
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from exc
    if not spec.patterns and any(not p.lstrip().startswith("#") for p in patterns):
        raise ValueError("no usable pattern")
    return [(p.regex.pattern if p.regex is not None else None, p.include) for p in spec.patterns]


class Matcher:
    def __init__(self, patterns: list[str] | tuple[str, ...], compiled: Compiled | None = None) -> None:
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
        self._compiled_re2: tuple[Any, Any] | None = None  # the bulk scanners, made when first needed
        self._compiled_re: re.Pattern[str] | None = None

    def to_data(self) -> dict[str, object]:
        return {"patterns": list(self.patterns), "compiled": self.compiled}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Matcher":
        return cls(data["patterns"], [(e, i) for e, i in data["compiled"]])

    def matches(self, path: str) -> bool:
        if self._negated:
            return self._decide_like_git(path)
        return any(regex.search(path) for _, regex, _, _ in self._rules)

    def matched_lines(self, text: str) -> list[int]:
        """The lines of `text` this matches, by index, ascending. `text` is paths joined by
        newlines, none holding one: one by one, even re2 costs about 1.5 µs a path; one
        scan of the joined text is C all the way."""
        if not self._rules:
            return []
        data = self._re2_input(text)
        if data is None:
            hit = self._hit(text)
            return [i for i, line in enumerate(text.split("\n")) if hit(line)]
        # "^" matches once a line, so each match is another line: its index is the
        # number of newlines before it, counted on from the previous match.
        found, line, pos = [], 0, 0
        for match in self._re2()[0].finditer(data):
            line += data.count(b"\n", pos, match.start())
            pos = match.start()
            found.append(line)
        return found

    def unmatched_lines(self, text: str) -> list[int]:
        """The lines of `text` (as for matched_lines) this does not match, by index, ascending.

        Allow rules match nearly every line, and re2's binding pays per match: one anchored
        match of the whole text answers "every line matches" instead. Only when it fails is
        the text looked at in chunks, and only the failing chunks line by line.
        """
        if not self._rules:
            return list(range(text.count("\n") + 1))
        data = self._re2_input(text)
        if data is None:
            hit = self._hit(text)
            return [i for i, line in enumerate(text.split("\n")) if not hit(line)]
        every = self._re2()[1]
        if every.fullmatch(data) is not None:
            return []
        lines, found = text.split("\n"), []
        for start in range(0, len(lines), _CHUNK):
            part = lines[start:start + _CHUNK]
            joined = "\n".join(part)
            if every.fullmatch(joined.encode()) is None:
                hit = self._hit(joined)
                found += [start + i for i, line in enumerate(part) if not hit(line)]
        return found

    def _re2_input(self, text: str) -> bytes | None:
        """`text` as re2 scans it, or None where another way is taken: negated patterns
        (they need git's directory rule), few lines, no re2, a name that is not UTF-8."""
        if self._negated or _few_lines(text) or _backend() != "re2":  # few first: a hook never looks for re2
            return None
        try:
            return text.encode()
        except UnicodeEncodeError:
            return None

    def _hit(self, text: str) -> Callable[[str], bool]:
        """Whether a line of `text` is matched, without re2: one by one for a few lines or
        negated patterns, else one scan with Python's re."""
        if self._negated or _few_lines(text):
            return self.matches
        return set(self._scanner().findall(text)).__contains__

    def _re2(self) -> tuple[Any, Any]:
        """re2 expressions over the whole text: one finding each line matched, one matching
        only a text whose every line is. Neither captures, so re2 answers from its DFA."""
        if self._compiled_re2 is None:
            import re2

            # re2 falls back from its DFA to a far slower engine (and logs to stderr) when
            # the DFA outgrows its memory: at the default 8 MB, allow and forbid lists of
            # 500 patterns each took 0.5 s on 100k paths, of 1500 each 90 s; at 64 MB, ~10 ms.
            options = re2.Options()
            options.max_mem, options.log_errors, options.never_capture = 64 << 20, False, True
            line = _line_expression([r.pattern for _, r, _, _ in self._rules])
            self._compiled_re2 = (re2.compile(f"(?m)^{line}".encode(), options),
                                  re2.compile(f"(?m)(?:{line}\n)*{line}".encode(), options))
        return self._compiled_re2

    def _scanner(self) -> "re.Pattern[str]":
        """Python's re over the whole text, finding every line matched (where re2 is not)."""
        if self._compiled_re is None:
            self._compiled_re = re.compile(f"(?m)^({_line_expression([r.pattern for _, r, _, _ in self._rules])})$")
        return self._compiled_re

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


def _few_lines(text: str) -> bool:
    """Whether `text` has fewer than _FEW lines, looking no further than the _FEW-th."""
    pos = -1
    for _ in range(_FEW - 1):
        pos = text.find("\n", pos + 1)
        if pos < 0:
            return True
    return False


def _line_expression(expressions: list[str]) -> str:
    """One expression matching, from the start of a line of paths joined by newlines, the
    whole of a line one of pathspec's expressions matches (as `search` would, anywhere in
    the path): nothing in it may cross into the next line."""
    alternatives = []
    for expr in expressions:
        expr = _single_line(expr)
        alternatives.append(expr[1:] if expr.startswith("^") else "[^\n]*?" + expr)
    return "(?:" + "|".join(f"(?:{a})" for a in alternatives) + ")[^\n]*"


def _single_line(expr: str) -> str:
    """pathspec's expression with "any character" and negated classes kept off newlines, and
    its named groups made plain. It reads the expression token by token: inside a class
    ("[a.]", "[^]a]") a "." or "]" is a character, not syntax."""
    out, i = [], 0
    while i < len(expr):
        if expr[i] == "\\":
            out.append(expr[i:i + 2])
            i += 2
        elif expr[i] == "[":
            end = _class_end(expr, i)
            negated = expr.startswith("[^", i)
            body = expr[i + 1 + negated:end]
            # After "[^\n" a leading "]" would close the class: escape it.
            out.append("[^\\n" + ("\\" + body if body.startswith("]") else body) + "]" if negated
                       else expr[i:end + 1])
            i = end + 1
        elif expr.startswith("(?P<", i):
            out.append("(?:")
            i = expr.index(">", i) + 1
        else:
            out.append("[^\\n]" if expr[i] == "." else expr[i])
            i += 1
    return "".join(out)


def _class_end(expr: str, start: int) -> int:
    """Where the character class opening at `start` closes (a "]" first in it is a member)."""
    i = start + 1 + expr.startswith("[^", start)
    i += expr.startswith("]", i)
    while expr[i] != "]":
        i += 2 if expr[i] == "\\" else 1
    return i
