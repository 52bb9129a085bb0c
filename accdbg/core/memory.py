"""Peak memory of this process, as the benchmarks and the workers report it."""

from __future__ import annotations

import resource
from pathlib import Path


def own_peak_rss_mb() -> float | None:
    """This process's peak RSS since its exec (``VmHWM``; Linux). ``getrusage`` would not do
    for a worker: a child's ``ru_maxrss`` keeps its parent's high-water mark from before its
    exec, so every worker would report at least the tool's own peak."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
