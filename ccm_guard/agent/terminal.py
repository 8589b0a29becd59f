"""What of the agent's output reaches the person's terminal.

The pty proxy passes the agent's output through as it comes (colours, cursor moves,
whole-screen interfaces), except the escape sequences that act on the terminal or the
machine rather than draw:

- OSC 52 (and kitty's OSC 5522): write (or read back) the system clipboard: a command
  pasted later is the agent's;
- OSC 50: changes or reports the font;
- OSC 1337 (iTerm2) and OSC 5113 (kitty): file transfer to and from the person's machine.

An OSC ends where terminals end it: at BEL or ST (ESC \\), and also at any other ESC, CAN or
SUB (which abort it), so a harmless OSC cannot carry a dropped one inside it. Its number
is read as terminals read it (`052` is 52). An OSC that the agent leaves unterminated is
held back until it ends, and dropped if it grows past OSC_LIMIT or the run ends first: a
terminal would otherwise swallow whatever follows, the verdict included.
"""

from __future__ import annotations

import re

DROPPED_OSC = frozenset({50, 52, 1337, 5113, 5522})
OSC_LIMIT = 1 << 16  # bytes of an unterminated OSC held back before it is dropped

_OSC = b"\x1b]"


class TerminalFilter:
    def __init__(self) -> None:
        self._held = b""
        self.dropped = 0  # sequences removed, for the record

    def feed(self, data: bytes) -> bytes:
        data, self._held = self._held + data, b""
        out = bytearray()
        at = 0
        while True:
            start = data.find(_OSC, at)
            if start < 0:
                keep = len(data) - 1 if data.endswith(b"\x1b") else len(data)  # ESC: perhaps an OSC begins
                out += data[at:keep]
                self._held = data[keep:]
                return bytes(out)
            out += data[at:start]
            end, size = _terminator(data, start + len(_OSC))
            if end < 0:
                if len(data) - start <= OSC_LIMIT:
                    self._held = data[start:]
                else:
                    self.dropped += 1
                return bytes(out)
            number = data[start + len(_OSC):end].split(b";", 1)[0]
            if size == 0 or _number(number) in DROPPED_OSC:
                self.dropped += 1  # dropped, or aborted (the terminal would not act on it either)
            else:
                out += data[start:end + size]
            at = end + size if size else end + (data[end:end + 1] != b"\x1b")  # an ESC starts what follows

    def finish(self) -> None:
        """The run is over: an OSC still open is dropped, never passed on."""
        if self._held.startswith(_OSC):
            self.dropped += 1
        self._held = b""


_ENDS = re.compile(rb"[\x07\x18\x1a\x1b]")


def _terminator(data: bytes, start: int) -> tuple[int, int]:
    """Where the OSC starting before `start` ends, and how many bytes of the terminator
    belong to it: BEL or ST (ESC \\) end it (1, 2); another ESC (which starts the next
    sequence), CAN or SUB abort it (0). (-1, 0): not yet."""
    found = _ENDS.search(data, start)
    if found is None:
        return -1, 0
    end = found.start()
    if data[end:end + 1] == b"\x07":
        return end, 1
    if data[end:end + 1] == b"\x1b":
        if end + 1 == len(data):
            return -1, 0  # an ESC at the very end: ST or not, the next read says
        return (end, 2) if data[end + 1:end + 2] == b"\\" else (end, 0)
    return end, 0


def _number(text: bytes) -> int | None:
    """An OSC's number as terminals read it: its decimal digits (`052` is 52)."""
    return int(text) if text.isdigit() and len(text) <= 8 else None
