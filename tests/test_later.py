"""ccm_guard.later: a call run on a thread, its result or exception kept for later."""

from __future__ import annotations

import gc
import weakref

import pytest

from ccm_guard.later import Later


class _Holder:
    """Something large that keeps a Later whose call refers back to it (as the judging
    context keeps its status walk)."""

    later: Later[int]


def _made_and_asked(thread: bool) -> weakref.ref[_Holder]:
    holder = _Holder()
    holder.later = Later(lambda: id(holder), thread=thread)
    assert holder.later.result() == id(holder)
    return weakref.ref(holder)


@pytest.mark.parametrize("thread", [True, False])
def test_a_call_that_refers_to_its_holder_ties_no_cycle(thread: bool) -> None:
    collecting = gc.isenabled()
    gc.disable()  # freed by reference counting alone, not by a collector pass
    try:
        assert _made_and_asked(thread)() is None
    finally:
        if collecting:
            gc.enable()


def test_a_failed_call_is_raised_where_the_result_is_asked() -> None:
    def fail() -> int:
        raise ValueError("no")

    later = Later(fail)
    with pytest.raises(ValueError, match="no"):
        later.result()
