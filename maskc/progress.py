"""A status line for slow steps of the ``maskc`` command (an NVRTC compile takes seconds).

    with status("NVRTC: compiling maskc_fwd_causal"):
        compile_to_cubin(src)

Nothing is written when the step ends within ``delay`` seconds or the stream is not a terminal (a pipe,
a file, CI's log): scripts and logs see only the command's own output. On a terminal the line shows the
step and the seconds spent, is rewritten in place, and is erased when the step ends, so the command's
next line starts clean.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO

DELAY_S = 1.0           # steps shorter than this show nothing
INTERVAL_S = 0.25       # how often the elapsed time is redrawn


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):        # a closed or exotic stream
        return False


@contextmanager
def status(message: str, stream: TextIO | None = None, delay: float = DELAY_S, interval: float = INTERVAL_S,
           enabled: bool | None = None) -> Iterator[None]:
    """Show ``message`` and the elapsed seconds on ``stream`` (stderr) while the block runs, if it runs longer
    than ``delay`` and the stream is a terminal (``enabled`` overrides that test)."""
    out = sys.stderr if stream is None else stream
    if not (_is_terminal(out) if enabled is None else enabled):
        yield
        return
    done = threading.Event()
    drawn = [False]
    start = time.monotonic()

    def draw() -> None:
        if done.wait(delay):
            return
        while True:
            out.write(f"\r\033[Kmaskc: {message} ({time.monotonic() - start:.0f} s)")
            out.flush()
            drawn[0] = True
            if done.wait(interval):
                return

    worker = threading.Thread(target=draw, name="maskc-status", daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()
        worker.join()
        if drawn[0]:
            out.write("\r\033[K")               # erase the line: the next output starts at column 0
            out.flush()
