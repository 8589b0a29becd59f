"""What of the agent's output reaches the person's terminal.

The pty proxy passes the agent's output through as it comes (colours, cursor moves,
whole-screen interfaces), except the escape sequences that act on the terminal or the
machine rather than draw:

- OSC 52: writes (or reads back) the system clipboard: a command pasted later is the agent's;
- OSC 50: changes or reports the font;
- OSC 1337 (iTerm2) and OSC 5113 (kitty): file transfer to and from the person's machine.

Both terminators are honoured (BEL and ESC \\). An OSC that the agent leaves unterminated
is held back until it ends, and dropped if it grows past OSC_LIMIT or the run ends first:
a terminal would otherwise swallow whatever follows, the verdict included.
"""

from __future__ import annotations

DROPPED_OSC = frozenset({b"50", b"52", b"1337", b"5113"})
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
            if number in DROPPED_OSC:
                self.dropped += 1
            else:
                out += data[start:end + size]
            at = end + size

    def finish(self) -> None:
        """The run is over: an OSC still open is dropped, never passed on."""
        if self._held.startswith(_OSC):
            self.dropped += 1
        self._held = b""


def _terminator(data: bytes, start: int) -> tuple[int, int]:
    """Where the OSC starting before `start` ends, and the terminator's length; (-1, 0) if not yet."""
    bel = data.find(b"\x07", start)
    st = data.find(b"\x1b\\", start)
    if bel < 0 and st < 0:
        return -1, 0
    if st < 0 or (0 <= bel < st):
        return bel, 1
    return st, 2
