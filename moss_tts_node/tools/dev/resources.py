"""What a benchmark process costs the machine, as the kernel reports it."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
