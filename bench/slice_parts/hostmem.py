"""Peak host memory of a server: the summed RSS of its process tree (API server, engine core, workers), sampled."""
from __future__ import annotations

import threading


def tree_rss(pid: int) -> int:
    """Summed resident set size (bytes) of `pid` and all its descendants; 0 when it is gone."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


class PeakRss:
    """Samples tree_rss(pid) every `interval` seconds in a daemon thread until stop(); `peak` and `last` in bytes."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.peak = self.last = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.last = tree_rss(self.pid)
            self.peak = max(self.peak, self.last)
            self._stop.wait(self.interval)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak
