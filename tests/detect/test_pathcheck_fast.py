"""The fast path check decides exactly as the path-by-path one it replaced.

`Rules.violations` scans all paths at once and `pathcheck.check` looks again only at the
changes something was found in; both are compared here with the plain one-by-one reading
(`Rules.violation` on each path, every change looked at, every tree path folded), on
generated rules, paths, modes and statuses. Lists are made long enough (64 paths and
more) for the whole-text scans to run, and past two chunks for the chunked search.
"""

from __future__ import annotations

import unicodedata
from typing import Callable, Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from ccm_guard.pathrules.check import (
    EXECUTABLE,
    GITLINK,
    SYMLINK,
    PathChange,
    Violation,
    _change,
    check,
)
from ccm_guard.pathrules.matcher import _CHUNK, _FEW
from ccm_guard.pathrules.rules import Rules

# Names that forbid rules catch, in other spellings (case, Unicode forms, "ß" folding to
# "ss"), with a newline, with trailing dots or spaces, or not UTF-8 (git's bytes read with surrogateescape).
NAMES = st.sampled_from([
    "src", "tests", "a.py", "A.PY", "test_x.py", "x_test.go", ".env", ".ENV.local", "secret.txt", "Secret.TXT",
    "key.pem", "é", "e\u0301", "É", "ß", "SS", "ss", "sp ace", "odd\nname", "\udcffbytes", "docs", "x.md", "]",
    ".gitattributes", ".GitModules", "node_modules", "lib",
    # names Windows takes without their trailing dots and spaces (the scan's substring precheck)
    ".gitattributes.", ".env ", "secret.txt. ", "lib.",
])
PATHS = st.lists(NAMES, min_size=1, max_size=3).map("/".join)
GLOBS = st.sampled_from(["src", "tests", "*.py", "test_*", "*_test.*", ".env*", "**/secret*", "*.pem", "é*", "ß",
                         "docs/*.md", "[!.]*", "[a.]", ".git*", "node_modules", "*", "lib", "SS"])
PATTERNS = st.builds(
    lambda lead, parts, trail, negate: ("!" if negate else "") + ("/" if lead else "") + "/".join(parts)
    + ("/" if trail else ""),
    st.booleans(), st.lists(GLOBS, min_size=1, max_size=2), st.booleans(), st.sampled_from([False] * 7 + [True]),
)
ALLOW = st.one_of(st.none(), st.just(()), st.lists(PATTERNS, min_size=1, max_size=6).map(tuple))
FORBID = st.lists(PATTERNS, min_size=0, max_size=6).map(tuple)
COUNTS = st.sampled_from([3, _FEW, 300, 2 * _CHUNK + 5])


def spread(items: list[str], count: int) -> list[str]:
    """`count` paths cycling through `items`, each cycle under its own directory so that
    most are distinct (the scan must point at the right line, not just a right name)."""
    return [items[i % len(items)] if i < len(items) else f"d{i // len(items)}/{items[i % len(items)]}"
            for i in range(count)]


@settings(max_examples=200, deadline=None)
@given(allow=ALLOW, forbid=FORBID, paths=st.lists(PATHS, min_size=1, max_size=10), count=COUNTS)
def test_bulk_violations_agree_with_one_by_one(allow: tuple[str, ...] | None, forbid: tuple[str, ...],
                                               paths: list[str], count: int) -> None:
    rules = Rules(allow, forbid)
    many = spread(paths, count)
    expected = {p: why for p in many if (why := rules.violation(p))}
    assert rules.violations(many) == expected


CHANGES = st.builds(
    lambda path, status, old_mode, new_mode, target, kept: (
        PathChange(path, status, old_mode, new_mode, None, None, "untracked" if status == "?" else "commit 1"),
        target, kept),
    PATHS, st.sampled_from(["A", "M", "D", "T", "?"]),
    st.sampled_from(["100644", "100644", EXECUTABLE, SYMLINK, "000000"]),
    st.sampled_from(["100644"] * 6 + [EXECUTABLE, SYMLINK, GITLINK, "000000"]),
    st.sampled_from([None, "../outside", "/etc/passwd", "a.py", "key.pem", "sub/../.env", "src"]),
    st.booleans(),  # still in the final tree (a path added, then deleted by a later commit, is not)
)
# Another spelling of a changed path in the final tree: a twin on some file systems.
SPELLINGS: dict[str, Callable[[str], str]] = {
    "upper": str.upper, "swapcase": str.swapcase, "same": str, "nfd": lambda p: unicodedata.normalize("NFD", p),
    "nfc": lambda p: unicodedata.normalize("NFC", p), "casefold": str.casefold,
}
TWINS = st.lists(st.tuples(st.integers(min_value=0, max_value=50), st.sampled_from(sorted(SPELLINGS))), max_size=4)


@settings(max_examples=200, deadline=None)
@given(allow=ALLOW, forbid=FORBID, changes=st.lists(CHANGES, min_size=1, max_size=8),
       tree=st.lists(PATHS, max_size=8), twins=TWINS, count=st.sampled_from([2, _FEW + 3, 300]))
def test_check_agrees_with_looking_at_every_change(
        allow: tuple[str, ...] | None, forbid: tuple[str, ...], changes: list[tuple[PathChange, str | None, bool]],
        tree: list[str], twins: list[tuple[int, str]], count: int) -> None:
    rules = Rules(allow, forbid)
    many = [(PathChange(path, c.status, c.old_mode, c.new_mode, None, None, c.where), target, kept)
            for path, (c, target, kept) in zip(spread([c.path for c, _, _ in changes], count), changes * count)]
    listed = [c for c, _, _ in many]
    targets = {c: target for c, target, _ in many}
    final = (spread(tree, len(tree) * 3) + [c.path for c, _, kept in many if kept and c.status != "D"]
             + [SPELLINGS[how](listed[i % len(listed)].path) for i, how in twins])
    expected = reference_check(listed, rules, targets.get, lambda: final)
    assert check(listed, rules, targets.get, lambda: final) == expected


def reference_check(changes: list[PathChange], rules: Rules, link_target: Callable[[PathChange], str | None],
                    final_paths: Callable[[], Iterable[str]]) -> list[Violation]:
    """pathcheck.check as it was before the fast path: every change matched one path at a
    time, and the twins found by folding every final path (no selection by set)."""
    found: list[Violation] = []
    # A link resolves through the links the change made (a link inside a linked directory):
    # every link that is there at the end and whose target can be read.
    links: dict[str, str] = {}
    for c in changes:
        target = link_target(c) if c.new_mode == SYMLINK and c.status != "D" else None
        if target:
            links[c.path] = target
    for c in changes:  # every change, matched on its own (what it finds is _change's, shared)
        found += _change(c, rules.violation(c.path), rules, link_target, links)
    added = [c for c in changes if c.status in ("A", "?")]
    if added:
        seen: dict[str, set[str]] = {}
        for path in final_paths():
            seen.setdefault(fold(path), set()).add(path)
        for c in added:
            others = sorted(seen.get(fold(c.path), set()) - {c.path})
            if others:
                found.append(Violation(c.path, f"is the same file as {others[0]!r} on case-insensitive "
                                       "or Unicode-normalising file systems", c.where))
    return found


def fold(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()


def test_a_quiet_change_of_many_paths_finds_nothing_and_one_offender_is_named() -> None:
    # The common case the fast path is for: thousands of allowed paths, and one that is not.
    rules = Rules(("src/", "*.py"), ("*.pem", ".env*"))
    paths = [f"src/d{i // 100}/f{i}.txt" for i in range(3 * _CHUNK)]
    changes = [PathChange(p, "M", "100644", "100644", None, None, "commit 1") for p in paths]
    assert check(changes, rules, lambda c: None, lambda: paths) == []
    changes[_CHUNK + 7] = PathChange("README", "M", "100644", "100644", None, None, "commit 1")
    changes[2 * _CHUNK] = PathChange("src/KEY.PEM", "D", "100644", "000000", None, None, "commit 2")
    assert [v.line() for v in check(changes, rules, lambda c: None, lambda: paths)] == [
        "README: changed, but not in the role's allow list (commit 1)",
        "src/KEY.PEM: deleted, but forbidden by '*.pem' (as 'src/key.pem', the same file on some systems) (commit 2)",
    ]


def test_twins_are_found_in_every_spelling_among_many_tree_paths() -> None:
    # The tree is folded as one text; each case below once needed its own care: Unicode
    # forms, case, "ß" folding to "ss", a name holding a newline (the text would not split
    # back), and an added path the final tree no longer holds (added, then deleted).
    rules = Rules(None, ())
    tree = [f"src/f{i}.txt" for i in range(3 * _FEW)]
    cases = [("caf\u00e9.md", "cafe\u0301.md"), ("README", "readme"), ("stra\u00dfe", "STRASSE"),
             ("odd\nname", "ODD\nNAME"), ("gone.txt", "GONE.TXT")]
    for added, other in cases:
        final = tree + [other] + ([] if added == "gone.txt" else [added])
        change = PathChange(added, "A", "000000", "100644", None, None, "commit 1")
        expected = reference_check([change], rules, lambda c: None, lambda: final)
        assert [v.reason for v in expected] == [f"is the same file as {other!r} on case-insensitive or "
                                                "Unicode-normalising file systems"]
        assert check([change], rules, lambda c: None, lambda: final) == expected


def test_names_the_tree_long_held_in_two_spellings_matter_only_to_an_added_twin() -> None:
    tree = [f"src/f{i}.txt" for i in range(3 * _FEW)] + ["Makefile", "makefile"]
    rules = Rules(None, ())
    for added, twins in (("new.txt", []), ("MAKEFILE", ["Makefile"]), ("Makefile", ["makefile"])):
        change = PathChange(added, "A", "000000", "100644", None, None, "commit 1")
        final = tree if added == "Makefile" else tree + [added]
        found = check([change], rules, lambda c: None, lambda: final)
        assert found == reference_check([change], rules, lambda c: None, lambda: final)
        assert [v.reason.split("'")[1] for v in found] == twins


def test_windows_and_mac_twins_of_a_control_file_are_caught_in_bulk_too() -> None:
    from ccm_guard.pathrules.rules import Rules
    from ccm_guard.policy import CONTROL_PATHS

    rules = Rules(None, CONTROL_PATHS)
    twins = [".gitattributes ", "sub/.gitmodules.", ".git\u200cattributes"]
    filler = [f"src/f{i}.py" for i in range(200)]
    found = rules.violations(filler + twins)
    assert sorted(found) == sorted(twins)
    assert all("the same file on some systems" in why for why in found.values())


def test_a_name_windows_takes_without_its_trailing_dot_or_space_is_found_in_a_long_list() -> None:
    """`lib.` and `lib ` are `lib` on Windows: among many plain names (the whole-text scan),
    each is still judged by the rule for `lib`, wherever in the name the dot or space is."""
    rules = Rules(None, ("lib", ".gitattributes"))
    odd = ["lib.", "lib ", "src/lib./x.py", ".gitattributes .", "lib. /y"]
    paths = spread(["a.py", "src/b.py"], 300) + odd
    assert sorted(rules.violations(paths)) == sorted(odd)
    assert sorted(rules.violations(paths[:-1] + ["tail."])) == sorted(odd[:-1])
