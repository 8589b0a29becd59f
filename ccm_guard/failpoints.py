"""Named points where the fault tests stop ccm-guard for real (SIGKILL) or make it wait.

`CCM_GUARD_FAILPOINT=<name>` kills the process at that point; `<name>:wait=<path>` creates
`<path>.reached` there and waits until `<path>` exists, so a test can act at exactly that
moment (commit to the target mid-apply). Unset, a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time


def point(name: str) -> None:
    spec = os.environ.get("CCM_GUARD_FAILPOINT")
    if not spec:
        return
    where, _, action = spec.partition(":")
    if where != name:
        return
    if action.startswith("wait="):
        go = action.removeprefix("wait=")
        open(go + ".reached", "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.01)
        return
    os.kill(os.getpid(), signal.SIGKILL)
