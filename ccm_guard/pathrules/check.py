"""A change's paths judged against a role's path rules: the pure part, no git.

Every way a changed path can break the rules (a forbidden path, a symlink out of the
tree or onto a forbidden path, a nested repository or gitlink, a new executable, a name
that is another's twin on macOS or Windows). detect.paths reads the changes from git for
a run and a range; detect.staged reads what is staged for a guard hook.

The guard hooks import this on every commit, so it imports nothing heavy: no
dataclasses, pathlib or typing (3 ms of every commit): the two record types are
collections.namedtuple at run time, typing.NamedTuple for mypy, with the same fields.
"""

from __future__ import annotations

import posixpath
import unicodedata
from collections import Counter, namedtuple
from operator import itemgetter

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Iterable, Mapping, NamedTuple

    from ccm_guard.pathrules.rules import Rules

SYMLINK, GITLINK, EXECUTABLE, MISSING = "120000", "160000", "100755", "000000"


if TYPE_CHECKING:
    class _ViolationFields(NamedTuple):
        path: str
        reason: str
        where: str
        severity: str = "fail"

    class PathChange(NamedTuple):
        path: str
        status: str  # A, M, D, T (committed or staged), or "?" untracked
        old_mode: str
        new_mode: str
        old_blob: str | None  # None where the content is in the work tree
        new_blob: str | None
        where: str  # the id of the commit that made it, or "staged", "uncommitted", "untracked"
else:
    _ViolationFields = namedtuple("Violation", "path reason where severity", defaults=("fail",))
    PathChange = namedtuple("PathChange", "path status old_mode new_mode old_blob new_blob where")


class Violation(_ViolationFields):
    __slots__ = ()

    def line(self) -> str:
        return f"{self.path}: {self.reason} ({self.where})"


def where_label(where: str) -> str:
    """A change's `where` as a finding shows it: a commit id as "commit <12 hex>"."""
    if len(where) in (40, 64) and not where.strip("0123456789abcdef"):
        return f"commit {where[:12]}"
    return where


def blob_id(oid: str) -> str | None:
    """A blob id from git's raw diff, or None for git's null id (all zeros: no blob)."""
    return None if oid and not oid.strip("0") else oid


def check(
    changes: list[PathChange],
    rules: Rules,
    link_target: Callable[[PathChange], str | None],
    final_paths: Callable[[], Iterable[str]],
) -> list[Violation]:
    """Every way a change can break the role's rules, one Violation each, in the order of
    the changes.

    A run may change 100k paths and nearly all are fine: the paths are decided in one scan
    (Rules.violations), the modes and statuses by set, and only the changes something
    was found in are looked at one by one.
    """
    found: list[Violation] = []
    paths = list(map(_PATH, changes))
    offenders = rules.violations(paths)
    special = set(map(_NEW_MODE, changes)) & _SPECIAL
    if offenders or special:
        links = {c.path: t for c in changes if c.new_mode == SYMLINK and c.status != "D" and (t := link_target(c))}
        for c in changes:
            if c.path in offenders or c.new_mode in special:
                found += _change(c, offenders.get(c.path), rules, link_target, links)
    statuses = set(map(_STATUS, changes))
    if statuses and statuses <= _ADDED:  # all added (a first commit, a new tree): no need to pick them out
        found += _twins(changes, paths, final_paths())
    elif statuses & _ADDED:
        added = [c for c in changes if c.status in _ADDED]
        found += _twins(added, [c.path for c in added], final_paths())
    return found


# A PathChange's fields by position, read for 100k changes a third faster than by name.
_PATH, _STATUS, _NEW_MODE = itemgetter(0), itemgetter(1), itemgetter(3)
_SPECIAL = frozenset((SYMLINK, GITLINK, EXECUTABLE))  # new modes that need a look on their own
_ADDED = frozenset(("A", "?"))


def _change(c: PathChange, why: str | None, rules: Rules, link_target: Callable[[PathChange], str | None],
            links: Mapping[str, str]) -> list[Violation]:
    """What is wrong with one change; `links` are the links the change made (path ->
    target), through which its own link's target is resolved."""
    found = []
    at = where_label(c.where)
    if why:
        verb = "deleted" if c.status == "D" else "changed"
        found.append(Violation(c.path, f"{verb}, but {why}", at))
    if c.new_mode == SYMLINK:
        found += _symlink(c.path, at, rules, link_target(c), links)
    elif c.new_mode == GITLINK and c.status != "D":
        what = "a nested git repository" if c.status == "?" else "a gitlink (submodule entry)"
        found.append(Violation(c.path, f"{what} was added", at))
    elif c.new_mode == EXECUTABLE and c.old_mode != EXECUTABLE:
        found.append(Violation(c.path, "made executable", at, "warn"))
    return found


def _symlink(path: str, at: str, rules: Rules, target: str | None, links: Mapping[str, str]) -> list[Violation]:
    if target is None:
        return [Violation(path, "is a symlink whose target could not be read", at)]
    others = {k: v for k, v in links.items() if k != path}
    resolved = None if posixpath.isabs(target) else _resolve(posixpath.join(posixpath.dirname(path), target), others)
    if resolved is None:
        return [Violation(path, f"is a symlink pointing outside the worktree ({target!r})", at)]
    why = rules.violation(resolved)
    if why:
        return [Violation(path, f"is a symlink to {resolved!r}, which is {why}", at)]
    return []


def _resolve(joined: str, links: Mapping[str, str], hops: int = 0) -> str | None:
    """Where a link's directory and target, joined, land inside the tree: `..` climbs from
    where a directory on the way really is, through the links the run made (`links`, path
    -> target) that it passes; None outside the tree, or after 40 links (a loop)."""
    parts = [p for p in joined.split("/") if p not in ("", ".")]
    at: list[str] = []
    for i, part in enumerate(parts):
        if part == "..":
            if not at:
                return None
            at.pop()
            continue
        at.append(part)
        here = "/".join(at)
        if here in links and i < len(parts) - 1:
            target = links[here]
            if hops >= 40 or posixpath.isabs(target):
                return None
            return _resolve(posixpath.join(posixpath.dirname(here), target, *parts[i + 1:]), links, hops + 1)
    return "/".join(at) or "."


def _twins(added: list[PathChange], paths: list[str], final: Iterable[str]) -> list[Violation]:
    """New paths (`paths` are theirs) that are another path on a case-insensitive or
    normalising file system."""
    final = list(final)
    if not _may_have_twins(paths, final):
        return []
    seen: dict[str, set[str]] = {}
    for path in final:
        seen.setdefault(_fold(path), set()).add(path)
    found = []
    for c in added:
        others = sorted(seen.get(_fold(c.path), set()) - {c.path})
        if others:
            found.append(Violation(c.path, f"is the same file as {others[0]!r} on case-insensitive "
                                   "or Unicode-normalising file systems", where_label(c.where)))
    return found


def _may_have_twins(paths: list[str], final: list[str]) -> bool:
    """False only when no added path (of `paths`) can have a twin, found without folding the
    names one by one (they are folded as one text) and with sets: True sends _twins the
    long way, which decides."""
    folded = _fold_all(final)
    if folded is None:
        return True
    folds, names = set(folded), set(final)
    if len(folds) != len(names):
        # Some names in the tree fold alike (two it has long held, perhaps): only a fold
        # an added path shares with them matters.
        shared = {fold for fold, n in Counter(folded).items() if n > 1}
        added = _fold_all(paths)
        if added is None or not shared.isdisjoint(added):
            return True
    # Every other fold in the tree belongs to one name: an added path in the tree is that
    # name itself, and one not in it (added, then deleted) has a twin if its fold is there.
    if names.issuperset(paths):
        return False
    outside = _fold_all(list(set(paths) - names))
    return outside is None or not folds.isdisjoint(outside)


def _fold_all(paths: list[str]) -> list[str] | None:
    """_fold of each path, done on them joined (normalising and case-folding never act
    across a newline); None when a name holds a newline and the text would not split back."""
    text = "\n".join(paths)
    if text.count("\n") != len(paths) - 1:
        return None
    return (text if text.isascii() else unicodedata.normalize("NFC", text)).casefold().split("\n")


def _fold(path: str) -> str:
    return unicodedata.normalize("NFC", path).casefold()
