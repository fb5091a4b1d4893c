"""What every adapter reports, computed the same way everywhere (stdlib only: the peers' venv
imports it too)."""

import resource
import time
from typing import Dict, List


def peak_rss_kb() -> int:
    """This process's peak resident set size so far, in KiB.

    Read from /proc (VmHWM) where it exists: ``ru_maxrss`` would also count the parent's pages
    this process shared between fork and exec, so a big harness would inflate a small client.
    """
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def round_trips(latencies: List[float], seconds: float) -> dict:
    """A round-trip run's result: the count, the wall time, and p50/p99 of the latencies."""
    latencies = sorted(latencies)
    return {
        "requests": len(latencies),
        "seconds": seconds,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1e6,
        "rss_kb": peak_rss_kb(),
    }


class Stopwatch:
    """Wall time and this process's CPU time (every thread's, user and system) since creation."""

    def __init__(self):
        self._wall = time.perf_counter()
        self._cpu = time.process_time()

    def elapsed(self) -> Dict[str, float]:
        return {"seconds": time.perf_counter() - self._wall, "cpu_seconds": time.process_time() - self._cpu}
