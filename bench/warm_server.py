"""The warm server for the benches' `--warm` units (docs/design-notes.md, "A warm server").

A bench that measures ccm-guard both ways runs its usual units with CCM_GUARD_NO_SERVER=1
(every command in a process of its own, as without a server) and its warm units through a
server of the same state home, each in a session of its own (a client with a controlling
terminal keeps its command). The server's own count must then show every warm unit
served, or the bench fails: a warm figure that was not served would be a lie.
"""

from __future__ import annotations

import atexit
import json
import subprocess
from pathlib import Path

OFF = {"CCM_GUARD_NO_SERVER": "1"}
# The least a served command costs: the interpreter's start and the installed command's
# first step (what its console script imports), before anything is handed over.
CLIENT_START = "import re, sys\nfrom ccm_guard.__main__ import main\nfrom ccm_guard.warm.client import through_server"


class WarmServer:
    """A server for `env`'s state home, started now and stopped at the latest when the
    bench exits (a failed bench must not leave it idling); `command` is ccm-guard's argv
    (the console script, or the interpreter with `-m ccm_guard`)."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        self.command, self.env = command, env
        state = self._ask("start", "--idle", "900")
        if not state.get("running"):
            raise RuntimeError(f"the warm server did not start: {state}")
        self.pid, self.expected = int(state["pid"]), int(state["served"])
        atexit.register(self.stop)

    def client_start(self) -> list[str]:
        """The least a served command costs: ccm-guard's interpreter starting, and the
        installed command's first step (what its console script imports)."""
        python = self.command[0] if len(self.command) > 1 else str(Path(self.command[0]).with_name("python3"))
        return [python, "-c", CLIENT_START]

    def _ask(self, *args: str) -> dict[str, object]:
        proc = subprocess.run([*self.command, "server", *args, "--json"], env={**self.env, **OFF},
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        try:
            return dict(json.loads(proc.stdout))
        except ValueError:
            raise RuntimeError(f"`ccm-guard server {args[0]}` failed ({proc.returncode}): {proc.stderr.strip()}")

    def count(self) -> None:
        """One more command is to be served."""
        self.expected += 1

    def check(self) -> None:
        state = self._ask("status")
        if state.get("pid") != self.pid or state.get("served") != self.expected:
            raise RuntimeError(f"the warm units were not all served: expected {self.expected} from server "
                               f"{self.pid}, status {state} (a terminal? another interpreter? see its log, "
                               f"{Path(self.env['CCM_GUARD_HOME']) / 'server.log'})")

    def stop(self) -> None:
        """Stopped (again: then there is none to stop)."""
        self._ask("stop")
