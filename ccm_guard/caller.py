"""Which process asked for this command: this one, or, for a command a warm server runs
(ccm_guard.warm), the client that handed it over. Where ccm-guard tells its own processes
and those it runs under from others (agent.processes), it starts from both."""

import os

CLIENT: "int | None" = None  # set in a warm server's child to its client's pid


def pids() -> "list[int]":
    """This process, and the client it runs a command for (if it does)."""
    return [os.getpid()] if CLIENT is None else [os.getpid(), CLIENT]
