"""A real pseudo-terminal for interactive tests: pexpect runs the program, pyte keeps the screen.

pexpect gives the program a pty of the size asked; everything it writes is fed
to pyte's VT emulator, so tests check what a person would see (after cursor
moves, redraws and colours), not the raw byte stream.
"""

from __future__ import annotations

import re
import time

import pexpect
import pyte


class Terminal:
    def __init__(self, argv: list[str], env: dict[str, str], *, rows: int = 60, cols: int = 140) -> None:
        self.child = pexpect.spawn(argv[0], argv[1:], env=env, dimensions=(rows, cols))
        self.screen = pyte.Screen(cols, rows)
        self.stream = pyte.ByteStream(self.screen)
        self.eof = False

    def pump(self, timeout: float = 0.05) -> None:
        try:
            self.stream.feed(self.child.read_nonblocking(1 << 16, timeout))
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            self.eof = True

    def text(self) -> str:
        return "\n".join(line.rstrip() for line in self.screen.display)

    def lines(self) -> list[str]:
        return [line.rstrip() for line in self.screen.display]

    def cursor_line(self) -> str:
        return self.screen.display[self.screen.cursor.y].rstrip()

    def wait(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        """Until `pattern` (a regex) is on the screen."""
        end = time.monotonic() + timeout
        while True:
            self.pump()
            m = re.search(pattern, self.text())
            if m:
                return m
            if self.eof or time.monotonic() > end:
                raise AssertionError(f"{pattern!r} is not on the screen:\n{self.text()}")

    def wait_prompt(self, prompt: str = "?-", timeout: float = 20.0) -> None:
        """Until the cursor sits on an empty prompt line (and stays there a moment)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            self.pump()
            if self.cursor_line() == prompt:
                self.pump(0.1)
                if self.cursor_line() == prompt:
                    return
        raise AssertionError(f"no {prompt!r} prompt on the screen:\n{self.text()}")

    def count(self, pattern: str) -> int:
        return len(re.findall(pattern, self.text()))

    def style_at(self, row: int, col: int) -> tuple[str, bool]:
        """Foreground colour and boldness of one cell."""
        char = self.screen.buffer[row][col]
        return char.fg, char.bold

    def send(self, text: str) -> None:
        self.child.send(text)

    def interrupt(self) -> None:
        self.child.sendintr()

    def close(self) -> int | None:
        if self.child.isalive():
            self.child.terminate(force=True)
        self.child.close()
        return self.child.exitstatus

    def wait_exit(self, timeout: float = 20.0) -> int | None:
        self.child.expect(pexpect.EOF, timeout=timeout)
        self.child.close()
        return self.child.exitstatus
