"""A call run on a thread while the caller goes on, its result or exception kept for later.

What ccm-guard needs of concurrent.futures (two git walks side by side) without its
import, which brings logging and costs ~4 ms of every start.
"""

from __future__ import annotations

import threading
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Later(Generic[T]):
    def __init__(self, call: Callable[[], T], *, thread: bool = True) -> None:
        """Start `call` on a thread now; with `thread=False`, run it here and now."""
        self._call = call
        self._value: T | None = None
        self._error: BaseException | None = None
        # Not a daemon: Python waits for it at exit, so no git it runs is cut off half-way.
        self._thread = threading.Thread(target=self._run) if thread else None
        if self._thread is None:
            self._run()
        else:
            self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # re-raised in the caller's thread by result()
            self._error = exc
        finally:
            # A call that refers to its own Later (ctx.x = Later(lambda: ... ctx ...)) would
            # tie it, and all it holds, into a cycle that only the collector frees, and
            # the command line makes that rare (cli/__init__.py): let go of it once run.
            del self._call

    def result(self) -> T:
        """The call's value once it has finished; its exception, raised again, if it failed."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]
