"""Progress on stderr for a step that takes more than a second (making a 60k-file worktree,
copying .worktreeinclude files, archiving, filling the pool) - on a terminal only.

Nothing is printed for a quick step, nor when stderr is not a terminal, nor when the
command prints JSON (`quiet()`): logs and orchestrators get no carriage returns.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Iterator

DELAY = 1.0  # a step shorter than this shows nothing
_quiet = False


def quiet() -> None:
    """No progress for the rest of this process (--json)."""
    global _quiet
    _quiet = True


def _shown() -> bool:
    stream = sys.stderr
    return not _quiet and stream is not None and stream.isatty()


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """`ccm-guard: WHAT... 3s` updated every second once the step has taken DELAY, and
    `done in 4.2s` at its end; nothing at all for a step quicker than that."""
    if not _shown():
        yield
        return
    start = time.monotonic()
    done = threading.Event()
    printed = threading.Event()

    def tick() -> None:
        while not done.wait(DELAY if not printed.is_set() else 1.0):
            sys.stderr.write(f"\rccm-guard: {what}... {time.monotonic() - start:.0f}s")
            sys.stderr.flush()
            printed.set()

    ticker = threading.Thread(target=tick, daemon=True)  # never keeps the process alive
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
        if printed.is_set():
            sys.stderr.write(f"\rccm-guard: {what}: done in {time.monotonic() - start:.1f}s\n")
            sys.stderr.flush()
