"""What `generate` shows while it works: progress bars and the run's lines on a terminal, the lines alone elsewhere
(docs/commands.md). A stage finds its bar through the thread that runs its pipeline."""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

BARS, LINES, QUIET = "bars", "lines", "quiet"
ROWS_POSITION = 0  # the rows bar on top, the stages' below it (a round's execution and the next one's CPU stages)


class Bar:
    """One tqdm bar, moved from any thread."""

    def __init__(self, bar):
        self._bar = bar
        self._lock = threading.Lock()

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self._bar.update(n)

    def grow(self, total: int) -> None:
        """Its total raised by `total` (a batch begins)."""
        with self._lock:
            self._bar.total = (self._bar.total or 0) + total
            self._bar.refresh()

    def show(self, done: int, note: str | None = None) -> None:
        with self._lock:
            self._bar.update(done - self._bar.n)
            if note is not None:
                self._bar.set_postfix_str(note, refresh=False)

    def close(self) -> None:
        with self._lock:
            self._bar.close()


class Display:
    """The terminal of one run: `mode` BARS, LINES or QUIET; `verbose` adds the detail lines to the bars."""

    def __init__(self, mode: str = QUIET, verbose: bool = False, file=None):
        self.mode = mode
        self.verbose = verbose
        self.file = file or sys.stderr
        self._rows: Bar | None = None
        self._positions: set[int] = set()
        self._lock = threading.Lock()
        self._local = threading.local()

    @classmethod
    def for_terminal(cls, quiet: bool, verbose: bool, file=None) -> Display:
        file = file or sys.stderr
        if quiet:
            return cls(QUIET, file=file)
        return cls(BARS if file.isatty() else LINES, verbose, file)

    def line(self, message: str) -> None:
        """One of the run's lines: above the bars, or on its own."""
        if self.mode == BARS:
            from tqdm import tqdm

            tqdm.write(message, file=self.file)
        elif self.mode == LINES:
            print(message, file=self.file, flush=True)

    def detail(self, message: str) -> None:
        """A line of detail (the execution's progress every 30 s): where there are no bars, or asked for."""
        if self.mode == LINES or (self.mode == BARS and self.verbose):
            self.line(message)

    def _bar(self, position: int, **kwargs) -> Bar:
        from tqdm import tqdm

        return Bar(tqdm(file=self.file, position=position, dynamic_ncols=True, **kwargs))

    def rows(self, done: int, total: int) -> None:
        """The rows made so far, of `total`."""
        if self.mode != BARS:
            return
        if self._rows is None:
            self._rows = self._bar(ROWS_POSITION, desc="rows", total=total, initial=done, unit="row")
        self._rows.show(done)

    @contextlib.contextmanager
    def stage(self, desc: str, total: int | None = None, unit: str = "candidate") -> Iterator[Bar | None]:
        """A bar for the enclosed work of this thread (None where there are no bars), closed at its end."""
        if self.mode != BARS:
            yield None
            return
        with self._lock:
            position = min(set(range(1, len(self._positions) + 2)) - self._positions)
            self._positions.add(position)
        bar = self._bar(position, desc=desc, total=total, unit=unit, leave=False)
        outer = getattr(self._local, "bar", None)
        self._local.bar = bar
        try:
            yield bar
        finally:
            self._local.bar = outer
            bar.close()
            with self._lock:
                self._positions.discard(position)

    def current(self) -> Bar | None:
        """The bar of this thread's stage, if it has one."""
        return getattr(self._local, "bar", None)

    def close(self) -> None:
        if self._rows is not None:
            self._rows.close()
            self._rows = None


_active = Display()  # the library's default: nothing shown


def active() -> Display:
    return _active


@contextlib.contextmanager
def showing(display: Display) -> Iterator[Display]:
    """`display` is what the run shows while the block runs (the command line's; the library shows nothing)."""
    global _active
    outer, _active = _active, display
    try:
        yield display
    finally:
        display.close()
        _active = outer
