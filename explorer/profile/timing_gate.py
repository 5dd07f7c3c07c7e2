"""A gate between the programs being prepared and the one being timed.

Measured profiling compiles the next programs on worker threads while the main thread times
the current one. Preparing a program disturbs a timing beside it: building and lowering it is
Python and holds the GIL, so a timed run waits to dispatch; compiling it for a GPU autotunes,
running candidate kernels on the very device being timed. The gate lets any number of
threads prepare at once, and a timing only alone: it waits for the preparations under way to
end and holds new ones back until it is done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class TimingGate:
    """Shared entry for preparing programs, exclusive entry for timing one."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._preparing = 0
        self._timing = False
        self._waiting_to_time = 0

    @contextmanager
    def preparing(self) -> Iterator[None]:
        """Prepare a program (build, lower, compile): alongside others, never beside a
        timing. A timing that waits goes first, so a stream of compiles cannot starve it."""
        with self._changed:
            self._changed.wait_for(lambda: not self._timing and not self._waiting_to_time)
            self._preparing += 1
        try:
            yield
        finally:
            with self._changed:
                self._preparing -= 1
                self._changed.notify_all()

    @contextmanager
    def timing(self) -> Iterator[None]:
        """Time a program with nothing being prepared beside it."""
        with self._changed:
            self._waiting_to_time += 1
            self._changed.wait_for(lambda: not self._timing and self._preparing == 0)
            self._waiting_to_time -= 1
            self._timing = True
        try:
            yield
        finally:
            with self._changed:
                self._timing = False
                self._changed.notify_all()
