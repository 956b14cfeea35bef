"""Progress with ETA for every long stage: a live tqdm bar on a terminal, plain lines in a log.

A stage that writes to a file or a pipe (the demo under `tee`, a job scheduler's log) still says what
it is doing: one line per interval (`$EYAS_PROGRESS_INTERVAL` seconds, default 15; a heartbeat thread
writes it even while one long item is in flight) plus a first and a last line, each with done/total,
rate, elapsed and ETA. Lines go to stderr, like tqdm's bar, so a
command's JSON on stdout stays parseable.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from eyas import env


def _hms(seconds: float) -> str:
    s = int(max(0, seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _interval() -> float:
    try:
        return float(env.get("EYAS_PROGRESS_INTERVAL"))
    except ValueError:
        return 15.0


class Progress:
    """`update(n)` as work finishes, `note(text)` for a short status, `close()` at the end (or use `with`)."""

    def __init__(self, desc: str, total: int | None, unit: str = "it", *, enabled: bool = True,
                 stream: TextIO | None = None, interval: float | None = None, initial: int = 0):
        self.desc, self.total, self.unit = desc, total, unit
        self.stream = stream or sys.stderr
        self.interval = _interval() if interval is None else interval
        # `initial`: work done before this process started (a resumed run); the rate counts only this run's
        self.n, self.start, self.t0, self.last, self.postfix, self.closed = initial, initial, time.perf_counter(), 0.0, "", False
        self.enabled = enabled
        self.bar = None
        if not enabled:
            return
        if getattr(self.stream, "isatty", lambda: False)():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=initial, desc=desc, unit=f" {unit}", file=self.stream,
                            dynamic_ncols=True)
        else:
            self._line()
            # A heartbeat: a long item (one generate batch, one 512-token turn) still gets its line per interval.
            # (interval 0 means a line per update: nothing to add.)
            self._stop = threading.Event()
            if self.interval > 0:
                threading.Thread(target=self._beat, daemon=True, name=f"progress-{desc}").start()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval):
            if time.perf_counter() - self.last >= self.interval:
                try:
                    self._line()
                except (OSError, ValueError):   # the stream was closed under us (interpreter exit): stop quietly
                    return

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.enabled and time.perf_counter() - self.last >= self.interval:
            self._line()

    def note(self, text: str) -> None:
        """A short status shown beside the count (the loss, the current τ ...)."""
        self.postfix = text
        if self.bar is not None:
            self.bar.set_postfix_str(text)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        elif self.enabled:
            self._stop.set()
            self._line(final=True)

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line(self, final: bool = False) -> None:
        now = time.perf_counter()
        self.last, elapsed = now, now - self.t0
        rate = (self.n - self.start) / elapsed if elapsed > 0 else 0.0
        of = f"/{self.total}" if self.total else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        if final:
            eta = "done"
        elif self.total and rate > 0:
            eta = f"ETA {_hms((self.total - self.n) / rate)}"
        else:
            eta = "ETA ?"
        extra = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}{of} {self.unit}{pct}, {rate:.2f} {self.unit}/s, "
              f"elapsed {_hms(elapsed)}, {eta}{extra}", file=self.stream, flush=True)
