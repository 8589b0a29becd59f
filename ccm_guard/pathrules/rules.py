"""A role's path rules: its allow and forbid lists, and every spelling a name may have.

A forbid rule holds for a path in any spelling that names the same file on macOS or
Windows; the patterns themselves are matched by matcher.py.
"""

from __future__ import annotations

import re
import unicodedata

TYPE_CHECKING = False  # no typing at import: the guard hooks load this on every commit
if TYPE_CHECKING:
    from typing import Any

from ccm_guard.pathrules.matcher import Matcher

# Code points HFS+ ignores in names (git's own list, utf8.c is_hfs_dotgit): `.git\u200cattributes`
# is `.gitattributes` on a Mac.
_HFS_IGNORABLE = re.compile("[\u200c-\u200f\u202a-\u202e\u206a-\u206f\ufeff]")
# NTFS drops a name's trailing dots and spaces: `.gitattributes ` is `.gitattributes` on Windows.
_NTFS_TRAILING = re.compile(r"[ .]+(?=/|$)")
WINDOWS_TWIN = re.compile(r"[^/\n.][ .]+(?=/|\n|$)")


def _windows_twin_in(text: str) -> bool:
    """WINDOWS_TWIN.search over many names joined by newlines. The scan costs 37 ms over
    100k names; a name part can only end in a dot or space where one stands before a
    slash, a newline or the end, which a few substring searches rule out first."""
    if not (" /" in text or "./" in text or " \n" in text or ".\n" in text or text.endswith((" ", "."))):
        return False
    return WINDOWS_TWIN.search(text) is not None


def spellings(path: str) -> list[str]:
    """The names a path may also have on disk, case-folded: both Unicode normal forms,
    without HFS+-ignorable code points and without NTFS's trailing dots and spaces.

    macOS and Windows file systems treat these as one file (and ignore case), so a rule
    forbidding one spelling must catch them all. Matching folded names against folded
    patterns is stricter than git on Linux, never looser.
    """
    names = {path, _HFS_IGNORABLE.sub("", path)}
    names |= {_NTFS_TRAILING.sub("", n) or n for n in names}
    folded = {n.casefold() for n in names}
    if all(n.isascii() for n in folded):
        return sorted(folded)
    return sorted({unicodedata.normalize(form, n) for n in folded for form in ("NFC", "NFD")})


class Rules:
    """A role's allow and forbid lists together."""

    def __init__(self, allow: tuple[str, ...] | None, forbid: tuple[str, ...],
                 ready: dict[str, Any] | None = None) -> None:
        if ready is not None:  # compiled earlier (to_data): no pathspec needed
            self.allow = Matcher.from_data(ready["allow"]) if ready["allow"] is not None else None
            self.forbid = Matcher.from_data(ready["forbid"])
            self.forbid_folded = Matcher.from_data(ready["forbid_folded"])
            return
        self.allow = Matcher(allow) if allow is not None else None
        self.forbid = Matcher(forbid)
        self.forbid_folded = Matcher([p.casefold() for p in forbid])

    def to_data(self) -> dict[str, Any]:
        return {"allow": self.allow.to_data() if self.allow else None, "forbid": self.forbid.to_data(),
                "forbid_folded": self.forbid_folded.to_data()}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> "Rules":
        return cls(None, (), data)

    def violations(self, paths: list[str]) -> dict[str, str]:
        """`violation` for many paths at once; only offenders are returned.

        Names in ASCII without a newline (nearly all) are joined into one text and scanned
        whole, C all the way; the rest (whose spellings differ) are taken one by one. Only
        forbidden paths are looked at again, to name the rule.
        """
        text = "\n".join(paths)
        if text.isascii() and text.count("\n") == len(paths) - 1 and not _windows_twin_in(text):
            plain, odd = paths, []  # no name holds a newline or ends in a dot or space
        else:
            def is_odd(p: str) -> bool:
                return not p.isascii() or "\n" in p or WINDOWS_TWIN.search(p) is not None

            plain = [p for p in paths if not is_odd(p)]
            odd = [p for p in paths if is_odd(p)]
            text = "\n".join(plain)
        found: dict[str, str] = {}
        if plain:
            # An ASCII name's only spelling is its lower case (see spellings).
            for i in self.forbid_folded.matched_lines(text.lower()):
                found[plain[i]] = self.violation(plain[i]) or "forbidden"
            if self.allow is not None:
                outside = self._outside_allow()
                for i in self.allow.unmatched_lines(text):
                    found.setdefault(plain[i], outside)  # a forbidden path keeps that reason
        for path in odd:
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
            return self._outside_allow()
        return None

    def _outside_allow(self) -> str:
        return "not in the role's allow list" if self.allow and self.allow.patterns else "the role may change no files"
