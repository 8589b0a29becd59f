"""What ccm-guard's git hooks decide: `ccm-guard hook NAME ARGS...`.

The sh hooks (hooks/hook.sh, written by prevent/hookfiles.py) start a fresh `python -I -S`
and call `cli()` only where there is something to decide. That start-up is paid on
every commit, so this module imports only `os` and `sys` at the top and everything
else where it is used (typing ~3 ms, json ~9 ms through re, pathlib and subprocess
more; see docs/design-notes.md#lean-imports-on-the-hook-path). `python -X importtime -m ccm_guard.prevent.hookrun` shows what it costs.

The task's settings come from the file named by CCM_GUARD_HOOK_SETTINGS. The hook
script sets that variable itself, from the path install baked into it, so an agent
cannot point the hooks at other settings through its environment. The file format
is documented in prevent/hookfiles.py (`write_settings`).

Every refusal prints one line per problem, `ccm-guard: refused: ...`, on stderr
(git shows it to whoever ran the command), appends one JSON line to the task's log
and exits 1.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import BinaryIO, Callable, Sequence

    Handler = Callable[["Settings", str, "list[str]", BinaryIO], int]

Settings = dict[str, list[str]]

# Refs git keeps per worktree (in the worktree's own admin dir): moving them
# touches no other checkout. HEAD and pseudo-refs (ORIG_HEAD, REBASE_HEAD, ...)
# are handled by `is_per_worktree`; `main-worktree/...` and `worktrees/<x>/...`
# name other worktrees' refs and are refused.
PER_WORKTREE_PREFIXES = ("refs/bisect/", "refs/worktree/", "refs/rewritten/")


def read_settings(path: str) -> Settings:
    """`key=value` lines (keys may repeat); blank lines and `#` comments skipped."""
    settings: Settings = {}
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def one(settings: Settings, key: str) -> str:
    values = settings.get(key)
    return values[-1] if values else ""


def is_per_worktree(ref: str) -> bool:
    if ref == "HEAD" or ref.startswith(PER_WORKTREE_PREFIXES):
        return True
    # Pseudo-refs are all capitals and underscores, no slash: ORIG_HEAD, AUTO_MERGE.
    bare = ref.replace("_", "")
    return bool(bare) and bare.isascii() and bare.isalpha() and bare.isupper()


def ref_allowed(ref: str, branch: str, allow: Sequence[str] = ()) -> bool:
    """Whether a task may update `ref`: its own branch, this worktree's own refs, and
    what the role allows (`allow`: full ref names, or prefixes ending in '/')."""
    if ref == f"refs/heads/{branch}" or is_per_worktree(ref):
        return True
    return any(ref == a or (a.endswith("/") and ref.startswith(a)) for a in allow)


# --- the hooks -------------------------------------------------------------------------


def pre_push(settings: Settings, name: str, args: list[str], stdin: BinaryIO) -> int:
    remote = args[0] if args else "a remote"
    return refuse(settings, name, args, "remote", [
        f"git push to {remote} from task {one(settings, 'task')}'s worktree: a task's commits "
        "leave this machine only through `ccm-guard apply`, after review"
    ])


def reference_transaction(settings: Settings, name: str, args: list[str], stdin: BinaryIO) -> int:
    # `committed` and `aborted` come too late to stop anything; `prepared` still can.
    if not args or args[0] != "prepared":
        return 0
    branch = one(settings, "branch")
    if not branch:
        return refuse(settings, name, args, "hook-error", [_reinstall("names no branch")])
    allow = settings.get("allow_ref", [])
    refused: list[str] = []
    # Split at newlines only: a ref name may hold U+2028 or U+0085, where str.splitlines
    # splits too ("refs/heads/<task branch>\u2028HEAD" would pass as two allowed names).
    for line in stdin.read().decode("utf-8", "surrogateescape").split("\n"):
        if not line:
            continue
        ref = line.split(" ", 2)[-1]  # "<old> <new> <ref>"
        if not ref_allowed(ref, branch, allow) and ref not in refused:
            refused.append(ref)
    if not refused:
        return 0
    return refuse(settings, name, args, "ref-write", [
        f"update of {', '.join(refused)}: task {one(settings, 'task')} may move only its own "
        f"branch {branch} (and this worktree's HEAD); the person moves other refs after review"
    ], refs=refused)


def pre_commit(settings: Settings, name: str, args: list[str], stdin: BinaryIO) -> int:
    ready = one(settings, "rules")
    try:
        # git runs hooks at the top of the worktree.
        if ready:  # the role's rules, compiled by exec: the fast road (no policy, no pathspec)
            import json

            from ccm_guard.detect import staged
            from ccm_guard.pathrules.rules import Rules

            violations = staged.refusals(Rules.from_data(json.loads(ready)), os.getcwd())
        else:
            from pathlib import Path

            from ccm_guard.detect.policy_at import check_staged

            # The policy as committed at the task's base: HEAD is the agent's to change.
            violations = check_staged(Path.cwd(), one(settings, "role"), one(settings, "base") or "HEAD")
    except ImportError as exc:
        return refuse(settings, name, args, "hook-error", [
            f"the path policy cannot be loaded ({exc}): reinstall ccm-guard with its dependencies"
        ])
    except Exception as exc:
        from ccm_guard.errors import GuardError

        if not isinstance(exc, GuardError):
            raise
        return refuse(settings, name, args, "path-policy", [exc.message])
    if not violations:
        return 0
    return refuse(settings, name, args, "path-policy", violations, violations=violations)


def commit_msg(settings: Settings, name: str, args: list[str], stdin: BinaryIO) -> int:
    """Add the configured trailers (`trailer=Key: value`); off unless install wrote some."""
    trailers = settings.get("trailer", [])
    if not trailers or not args:
        return 0
    from ccm_guard import git

    command = ["interpret-trailers", "--in-place", "--if-exists", "replace"]
    for trailer in trailers:
        command += ["--trailer", trailer]
    # No repository: the agent's trailer.* config cannot reshape what is added.
    result = git.run([*command, os.path.abspath(args[0])], check=False)
    if result.returncode != 0:
        sys.stderr.write(f"ccm-guard: warning: trailers not added: {git.describe_failure(result)}\n")
    return 0


HANDLERS: dict[str, Handler] = {
    "pre-push": pre_push,
    "reference-transaction": reference_transaction,
    "pre-commit": pre_commit,
    "commit-msg": commit_msg,
}


# --- refusing and logging --------------------------------------------------------------


def _reinstall(what: str) -> str:
    return f"the task's hook settings {what}: reinstall the hooks (ccm-guard install --worktree PATH)"


def refuse(settings: Settings, name: str, args: list[str], op: str, lines: list[str],
           **extra: list[str]) -> int:
    sys.stderr.write("".join(f"ccm-guard: refused: {line}\n" for line in lines))
    log = one(settings, "log")
    if log:
        record = {"ts": _now(), "source": "hook", "hook": name, "op": op, "reason": "; ".join(lines),
                  "task": one(settings, "task"), "argv": [name, *args], **extra}
        append_log(log, record)
    return 1


def _now() -> int:
    import time

    return int(time.time())


def append_log(path: str, record: dict[str, object]) -> None:
    """One JSON line, written with one write on an O_APPEND file (no interleaving with
    the shim's lines); a log that cannot be written does not change the answer."""
    import json

    data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "surrogateescape")
    for attempt in range(2):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except FileNotFoundError:
            if attempt:
                return
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError:
                return
            continue
        except OSError:
            return
        try:
            os.write(fd, data)
        except OSError:
            pass
        finally:
            os.close(fd)
        return


# --- entry points ----------------------------------------------------------------------


def main(name: str, args: Sequence[str], stdin: BinaryIO) -> int:
    """Run hook `name`; the exit code is git's answer (0 go on, non-zero stop)."""
    path = os.environ.get("CCM_GUARD_HOOK_SETTINGS", "")
    try:
        settings = read_settings(path)
    except OSError as exc:
        where = path or "(CCM_GUARD_HOOK_SETTINGS is unset)"
        return refuse({}, name, list(args), "hook-error", [_reinstall(f"cannot be read: {where}: {exc.strerror}")])
    handler = HANDLERS.get(name)
    return handler(settings, name, list(args), stdin) if handler else 0


def cli(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.stderr.write("usage: python -m ccm_guard.prevent.hookrun HOOK [ARGS...] (the hooks ccm-guard install writes run it)\n")
        return 2
    if sys.stdin is None:  # git always gives hooks a stdin; a person might not
        with open(os.devnull, "rb") as devnull:
            return main(argv[0], argv[1:], devnull)
    return main(argv[0], argv[1:], sys.stdin.buffer)


if __name__ == "__main__":
    sys.exit(cli())
