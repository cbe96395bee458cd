"""Ctrl-C between training steps, never inside one, so the state a trainer saves on an interrupt is whole.

While `steps_interruptible()` is open in the main thread, the first SIGINT only sets `requested`; the
training loop checks it after each step and raises KeyboardInterrupt there, after saving its state. A
second SIGINT interrupts at once (Python's own handler is back by then). Elsewhere (another thread, a
process whose SIGINT handler is not Python's) nothing changes.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class InterruptRequest:
    """Whether Ctrl-C was pressed while the block ran."""

    def __init__(self) -> None:
        self.requested = False


@contextmanager
def steps_interruptible() -> Iterator[InterruptRequest]:
    request = InterruptRequest()
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield request
        return
    previous = signal.getsignal(signal.SIGINT)

    def defer(signum: int, frame: Any) -> None:
        request.requested = True
        signal.signal(signal.SIGINT, previous)  # a second Ctrl-C stops at once

    signal.signal(signal.SIGINT, defer)
    try:
        yield request
    finally:
        signal.signal(signal.SIGINT, previous)
