"""Whether a process's resident memory, sampled over a long run, keeps growing (a leak) or only stepped up.

A leak grows memory a little with every request, so it shows in every part of a run; an allocator arena, a cache
or a pool that grows once steps up and stays flat. ``late_growth_kib`` measures the growth over the second half of
the samples without its largest single rise between two consecutive samples: a lone step adds nothing to it, a leak
all but one sample interval of its growth. The test_memory_growth.py cases check it on recorded curves.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

EDGE = 3  # samples whose median stands for each end of the second half: one sample's noise moves neither end
# test_ros_node.py's soak (756 requests, sampled every 18) fails where late_growth_kib exceeds this: a leak of 32 KiB
# kept per request fails it, one step of an arena or a cache that then stays flat does not (test_memory_growth.py).
# docs/ros.md, "Requests", has a measured curve.
SOAK_RSS_GROWTH_KIB = 8 * 1024


def late_growth_kib(rss_kib: Sequence[int]) -> float:
    """KiB the second half of the samples grew by, its largest rise between two consecutive samples not counted."""
    half = list(rss_kib[len(rss_kib) // 2 :])
    if len(half) < 2 * EDGE:
        raise ValueError(f"{len(rss_kib)} samples are too few to tell a leak from a step: take at least {4 * EDGE}")
    growth = statistics.median(half[-EDGE:]) - statistics.median(half[:EDGE])
    largest_rise = max(0, *(later - earlier for earlier, later in itertools.pairwise(half)))
    return growth - largest_rise
