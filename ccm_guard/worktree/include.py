"""`.worktreeinclude`: the ignored files of the person's checkout a new worktree needs.

The convention Claude Code uses (Codex, Conductor and ccmanager read the same file): a
file at the top of the checkout, in gitignore syntax, naming files git ignores that a
fresh worktree lacks: `.env`, `node_modules/`, build caches. A path is copied only when
a pattern matches it AND git ignores it, so a tracked file is never copied, nor an
untracked one the repository does not ignore; git does both matchings (its own rules,
exactly). Nothing is followed out of the checkout: a symlink is copied as a symlink, a
nested `.git` is never copied, and nothing is written through a symlink or over an
existing file in the new worktree.

Files are reflinked where the file system can (FICLONE: btrfs, XFS, bcachefs), else
copied in the kernel (copy_file_range), else read and written; modes and times are kept.
With `link_dirs`, each directory the patterns take whole is a symlink to the checkout's
instead of a copy (fast for a big `node_modules/`, but the agent then writes into the
person's checkout unless the sandbox stops it).

The copying functions here are also the copied-directory strategy's (copyexec).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import fcntl
import hashlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Callable

from ccm_guard import git

INCLUDE_FILE = ".worktreeinclude"
FICLONE = 0x40049409  # _IOW(0x94, 9, int), linux/fs.h

# errnos that mean "this file system (pair) cannot do that", not "this file is bad".
_UNSUPPORTED = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF, errno.EPERM}


# --- copying one file, reflink first ---------------------------------------------------------


class Cloner:
    """Copies regular files, reflinking where the file systems allow it.

    Remembers which (source device, destination device) pairs refused a reflink, so a
    large tree on ext4 pays for one failed ioctl, not one per file.
    """

    def __init__(self) -> None:
        self._no_reflink: set[tuple[int, int]] = set()
        self._no_kernel_copy: set[tuple[int, int]] = set()

    def copy(self, src: str | Path, dst: str | Path, *,
             digest: bool = False) -> tuple[str, os.stat_result, os.stat_result, str | None]:
        """Copy `src` (not following a symlink) to a new file `dst` (never over one).

        Returns how ("reflink" or "copy"), the source's stat as it was opened, the copy's
        stat once written, and the sha256 of what was written when `digest` is asked for.
        """
        # Non-blocking: a FIFO put where a file was listed must not hang the copy.
        src_fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(src_fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(errno.EINVAL, "not a regular file", str(src))
            dst_fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                how = self._fill(src_fd, dst_fd, st, os.fstat(dst_fd).st_dev)
                os.fchmod(dst_fd, stat.S_IMODE(st.st_mode))
                os.utime(dst_fd, ns=(st.st_atime_ns, st.st_mtime_ns))
                hashed = self._digest(src_fd, dst_fd, st) if digest else None
                written = os.fstat(dst_fd)
            except BaseException:
                os.close(dst_fd)
                os.unlink(dst)  # a half-written copy must not pass for a faithful one
                raise
            os.close(dst_fd)
        finally:
            os.close(src_fd)
        return how, st, written, hashed

    @staticmethod
    def _digest(src_fd: int, dst_fd: int, st: os.stat_result) -> str:
        """The sha256 of the copy, read from the source: its pages are the ones in memory (a
        reflinked copy's are not), and it holds the same bytes unless it changed meanwhile,
        which its ctime would show: then the copy itself is read."""
        hashed = digest_fd(src_fd, st.st_size)
        now = os.fstat(src_fd)
        if (now.st_size, now.st_mtime_ns, now.st_ctime_ns) == (st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return hashed
        return digest_fd(dst_fd, os.fstat(dst_fd).st_size)

    def _fill(self, src_fd: int, dst_fd: int, st: os.stat_result, dst_dev: int) -> str:
        pair = (st.st_dev, dst_dev)
        if st.st_size == 0:
            return "copy"
        if pair not in self._no_reflink:
            try:
                fcntl.ioctl(dst_fd, FICLONE, src_fd)
                return "reflink"
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    raise
                self._no_reflink.add(pair)
        if pair not in self._no_kernel_copy and _kernel_copy(src_fd, dst_fd):
            return "copy"
        self._no_kernel_copy.add(pair)
        _user_copy(src_fd, dst_fd)
        return "copy"


def _kernel_copy(src_fd: int, dst_fd: int) -> bool:
    """copy_file_range until the end; False when the kernel refuses before any byte moved."""
    moved = 0
    while True:
        try:
            n = os.copy_file_range(src_fd, dst_fd, 1 << 30)
        except OSError as exc:
            if moved == 0 and exc.errno in _UNSUPPORTED:
                return False
            raise
        if n == 0:
            return True
        moved += n


def _user_copy(src_fd: int, dst_fd: int) -> None:
    os.lseek(src_fd, 0, os.SEEK_SET)
    os.lseek(dst_fd, 0, os.SEEK_SET)
    os.ftruncate(dst_fd, 0)
    while chunk := os.read(src_fd, 1 << 20):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst_fd, view):]


def digest_fd(fd: int, size: int) -> str:
    """The sha256 of an open regular file of about `size` bytes, read from its start."""
    if size < 1 << 20:  # most files: one read, no file object
        return hashlib.sha256(os.pread(fd, size + 1, 0)).hexdigest()
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", closefd=False) as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def copy_symlink(src: str | Path, dst: str | Path) -> str:
    """Make `dst` a symlink with `src`'s target (never followed); returns the target."""
    target = os.readlink(src)
    os.symlink(target, dst)
    return target


# --- copying a tree ------------------------------------------------------------------------------

# Called for everything copied or left out: (relative path, kind "f"/"l"/"d"/"o", the
# source's lstat, how, a file's sha256 or a symlink's target, a file copy's stat).
Visit = Callable[[str, str, os.stat_result, str, "str | None", "os.stat_result | None"], None]


def copy_tree(cloner: Cloner, src: str | Path, dst: str | Path, visit: Visit, *, rel: str = "",
              skip_names: frozenset[str] = frozenset(), digest: bool = False,
              st: os.stat_result | None = None) -> None:
    """Copy the directory `src` to `dst` (which must not exist), never following a symlink.

    Symlinks are copied as symlinks, special files (FIFOs, sockets, devices) are not
    copied (a FIFO would block the copy) but reported to `visit` as kind "o". A
    directory gets its mode and times after its content, so a read-only one can be filled.
    Paths are plain strings inside: pathlib costs more than the copying on small files.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    st = st or os.lstat(src)
    os.mkdir(dst, 0o700)
    visit(rel, "d", st, "mkdir", None, None)
    with os.scandir(src) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        if entry.name in skip_names:
            continue
        copy_entry(cloner, entry.path, os.path.join(dst, entry.name), visit,
                   rel=f"{rel}/{entry.name}" if rel else entry.name, skip_names=skip_names, digest=digest,
                   st=entry.stat(follow_symlinks=False))
    os.chmod(dst, stat.S_IMODE(st.st_mode))
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_entry(cloner: Cloner, src: str | Path, dst: str | Path, visit: Visit, *, rel: str,
               skip_names: frozenset[str] = frozenset(), digest: bool = False,
               st: os.stat_result | None = None) -> None:
    """Copy one file, symlink or directory (recursively) as it is, not following links."""
    st = st or os.lstat(src)
    if stat.S_ISDIR(st.st_mode):
        copy_tree(cloner, src, dst, visit, rel=rel, skip_names=skip_names, digest=digest, st=st)
    elif stat.S_ISLNK(st.st_mode):
        visit(rel, "l", st, "symlink", copy_symlink(src, dst), None)
    elif stat.S_ISREG(st.st_mode):
        how, opened, written, hashed = cloner.copy(src, dst, digest=digest)
        visit(rel, "f", opened, how, hashed, written)
    else:
        visit(rel, "o", st, "skipped", None, None)


# --- .worktreeinclude ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Included:
    """One path the patterns selected: a file, a symlink, or a directory taken whole."""

    path: str  # relative to the top; a directory ends in "/"
    how: str  # "reflink", "copy", "mixed" (a directory of both), "symlink", or "link" (--link-dirs)
    files: int  # regular files and symlinks written
    bytes: int


@dataclasses.dataclass
class IncludeResult:
    source: str | None  # the .worktreeinclude read; None when the checkout has none
    included: list[Included] = dataclasses.field(default_factory=list)
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (path, why)
    warnings: list[str] = dataclasses.field(default_factory=list)
    # Files written by each method ("reflink", "copy", "symlink"), and directories linked ("link").
    by_how: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    @property
    def files(self) -> int:
        return sum(i.files for i in self.included)

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.included)

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "files": self.files, "bytes": self.bytes, "by_how": dict(self.by_how),
                "included": [dataclasses.asdict(i) for i in self.included],
                "skipped": [{"path": p, "why": w} for p, w in self.skipped], "warnings": self.warnings}


def copy_included(main_worktree: Path, new_worktree: Path, link_dirs: bool = False) -> IncludeResult:
    """Copy into `new_worktree` the ignored files of `main_worktree` its .worktreeinclude names.

    Runs right after the worktree is made, before any agent exists: both trees are the
    person's and ccm-guard's. A path that cannot be copied is skipped with its reason
    (the run goes on without it); git failing on the checkout is an error.
    """
    found = git.discover(main_worktree)
    include = found.toplevel / INCLUDE_FILE
    patterns = _read_patterns(include)
    if patterns is None:
        return IncludeResult(None)
    result = IncludeResult(str(include))
    repo = found.repo()
    cloner = Cloner()
    for path in _selected(repo, patterns):
        result.included += _include_one(cloner, found.toplevel, new_worktree, path, link_dirs, result)
    linked = [i.path for i in result.included if i.how == "link"]
    if linked:
        _copy_unignored_links(cloner, found.toplevel, new_worktree, linked, result)
    return result


def _read_patterns(include: Path) -> str | None:
    """The file's text, or None when there is none. A symlink is not followed: the
    patterns come from the checkout itself."""
    try:
        fd = os.open(include, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None  # a symlink named .worktreeinclude: not the checkout's own file
        raise
    with open(fd, "rb") as fh:
        return fh.read().decode("utf-8", "surrogateescape")


def _selected(repo: git.Repo, patterns: str) -> list[str]:
    """Paths both ignored by the repository and matched by the patterns (git matches both).

    Either listing may name a directory whole ("node_modules/") where the other names
    paths inside it; the intersection keeps the narrower of each overlapping pair.
    """
    with tempfile.NamedTemporaryFile("wb", prefix="ccm-guard-include-", suffix=".txt") as fh:
        fh.write(patterns.encode("utf-8", "surrogateescape"))
        fh.flush()
        matched = git.untracked_matching(repo, Path(fh.name))
    if not matched:
        return []
    ignored = set(git.ignored_untracked(repo))
    wanted = set(matched)
    both = {a for a in ignored if _within(a, wanted)} | {m for m in wanted if _within(m, ignored)}
    # git lists an ignored directory and files in it side by side at times: keep the top.
    kept = [p for p in both if not _inside(p, both)]
    return sorted(p for p in kept if ".git" not in p.rstrip("/").split("/"))


def _within(path: str, entries: set[str]) -> bool:
    """Whether `path` is one of `entries` or inside one of its directories ("dir/")."""
    return path in entries or _inside(path, entries)


def _inside(path: str, entries: set[str]) -> bool:
    parts = path.rstrip("/").split("/")
    return any("/".join(parts[:i]) + "/" in entries for i in range(1, len(parts)))


def _include_one(cloner: Cloner, top: Path, new: Path, path: str, link_dirs: bool,
                 result: IncludeResult) -> list[Included]:
    rel = path.rstrip("/")
    src, dst = top / rel, new / rel
    try:
        if _both_directories(src, dst):
            # The worktree has this directory (it tracks files in it): add what it lacks.
            return [item for name in sorted(os.listdir(src)) if name != ".git"
                    for item in _include_one(cloner, top, new, f"{rel}/{name}", link_dirs, result)]
        why = _unsafe(top, new, rel)
        if why:
            result.skipped.append((path, why))
            return []
        if link_dirs and stat.S_ISDIR(os.lstat(src).st_mode):
            os.symlink(src, dst)
            result.by_how["link"] += 1
            return [Included(rel + "/", "link", 0, 0)]
        return [_copy_one(cloner, src, dst, rel, result)]
    except OSError as exc:
        result.skipped.append((path, f"could not copy: {exc.strerror or exc}"))
        return []


def _both_directories(src: Path, dst: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(src).st_mode) and stat.S_ISDIR(os.lstat(dst).st_mode)
    except FileNotFoundError:
        return False


def _copy_one(cloner: Cloner, src: Path, dst: Path, rel: str, result: IncludeResult) -> Included:
    files, size, hows = 0, 0, set()

    def visit(child: str, kind: str, st: os.stat_result, how: str, *_: object) -> None:
        nonlocal files, size
        if kind == "o":
            result.skipped.append((child, "not a regular file, symlink or directory"))
        elif kind in ("f", "l"):
            files += 1
            size += st.st_size if kind == "f" else 0
            hows.add(how)
            result.by_how[how] += 1

    is_dir = stat.S_ISDIR(os.lstat(src).st_mode)
    copy_entry(cloner, src, dst, visit, rel=rel, skip_names=frozenset({".git"}))
    how = hows.pop() if len(hows) == 1 else ("mixed" if hows else "copy")
    return Included(rel + "/" if is_dir else rel, how, files, size)


def _unsafe(top: Path, new: Path, rel: str) -> str | None:
    """Why `rel` must not be copied from `top` to `new`, or None when it may (making the
    directories it needs in `new`: only ignored files live there, so git made none)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if not stat.S_ISDIR(os.lstat(top / parent).st_mode):
            return f"{parent} is not a directory in your checkout (a symlink is never followed)"
        try:
            mode = os.lstat(new / parent).st_mode
        except FileNotFoundError:
            os.mkdir(new / parent)
            continue
        if not stat.S_ISDIR(mode):
            return f"{parent} is a symlink or file in the new worktree: nothing is written through it"
    if os.path.lexists(new / rel):
        return "the new worktree already has this path (tracked at the task's base): not overwritten"
    return None


def _copy_unignored_links(cloner: Cloner, top: Path, new: Path, linked: list[str], result: IncludeResult) -> None:
    """A directory-only rule (`node_modules/`), or rules matching only what is inside, do not
    match a symlink: git would count the link as an untracked file, and the clean-tree and
    path-policy gates would fail every run. Such a directory is copied instead, with a
    warning saying how to get it linked."""
    found = git.discover(new)
    repo = found.repo()
    names = [p.rstrip("/") for p in linked]
    ignored = {rule.path for rule in git.check_ignore(repo, names)}
    for path, rel in zip(linked, names):
        if rel in ignored:
            continue
        os.unlink(new / rel)
        result.by_how["link"] -= 1
        result.included = [i for i in result.included if i.path != path]
        result.included.append(_copy_one(cloner, top / rel, new / rel, rel, result))
        result.warnings.append(
            f"{rel}/ was copied, not linked: git would not ignore a symlink there (its rules match "
            f"directories only, or what is inside), and the gates would count it as an untracked file; "
            f"ignore `{rel}` itself, without a trailing slash, to have it linked"
        )
    if not result.by_how["link"]:
        del result.by_how["link"]
