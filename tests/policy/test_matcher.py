"""The built-in patterns' translations kept in the matcher are pathspec's own."""

from __future__ import annotations

import subprocess
import sys

from ccm_guard.pathrules.matcher import KNOWN, Matcher, translate
from ccm_guard.policy import BUILTIN


def builtin_patterns() -> list[str]:
    found = [p for role in BUILTIN.values() for key in ("allow", "forbid") for p in role.get(key) or ()]
    return list(dict.fromkeys([*found, *(p.casefold() for p in found)]))


def test_every_builtin_pattern_is_known_as_pathspec_translates_it() -> None:
    patterns = builtin_patterns()
    assert patterns and set(patterns) <= set(KNOWN), "a built-in pattern is missing from KNOWN"
    fresh = translate(tuple(KNOWN))
    stale = {p: expr for p, (expr, include) in zip(KNOWN, fresh) if (KNOWN[p], True) != (expr, include)}
    assert not stale, f"pathspec translates these differently now; KNOWN should read: {stale!r}"


def test_a_builtin_role_is_matched_without_importing_pathspec() -> None:
    code = ("import sys; from ccm_guard.policy import BUILTIN; from ccm_guard.pathrules.rules import Rules; "
            "r = Rules(None, tuple(BUILTIN['implementor']['forbid'])); "
            "print(r.violations(['a/.gitignore', 'src/x.py']), 'pathspec' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split()[-1] == "False" and "a/.gitignore" in out


def test_an_unknown_pattern_is_translated_by_pathspec() -> None:
    m = Matcher(["docs/**/*.md", "**/.git"])
    assert m.matches("docs/a/b.md") and m.matches("x/.git/config") and not m.matches("src/b.md")
