"""memory_growth.late_growth_kib on a soak's recorded curve: a one-time step passes, a leak fails.

soak_rss.json is the node's RSS as test_ros_node.py's soak sampled it (once per cycle of 18 requests), printed by
`pytest -s test/test_ros_node.py -k soak` on 2026-12-03. The step and the leak are added to that real curve, so
the noise between samples is the node's own.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memory_growth import SOAK_RSS_GROWTH_KIB, late_growth_kib

RECORDED = json.loads((Path(__file__).parent / "data" / "soak_rss.json").read_text())
REQUESTS = [requests for requests, _ in RECORDED]
RSS_KIB = [kib for _, kib in RECORDED]


def _with(extra_kib: list[float]) -> list[int]:
    return [round(kib + extra) for kib, extra in zip(RSS_KIB, extra_kib, strict=True)]


def test_the_recorded_soak_passes() -> None:
    assert late_growth_kib(RSS_KIB) <= SOAK_RSS_GROWTH_KIB


@pytest.mark.parametrize("at_request", [300, 480, 700])
def test_one_step_that_then_stays_flat_passes(at_request: int) -> None:
    """The step that failed the old check (issue 36): 202.6 to 211.1 MB at about request 480 of 756, then flat."""
    step_kib = (211.1 - 202.6) * 1e6 / 1024
    assert late_growth_kib(_with([step_kib if requests >= at_request else 0.0 for requests in REQUESTS])) <= (
        SOAK_RSS_GROWTH_KIB
    )


@pytest.mark.parametrize("kib_per_request", [32, 64])
def test_a_leak_kept_by_every_request_fails(kib_per_request: int) -> None:
    assert late_growth_kib(_with([kib_per_request * requests for requests in REQUESTS])) > SOAK_RSS_GROWTH_KIB


def test_a_leak_with_a_step_on_top_fails() -> None:
    """The largest rise is left out once: a leak does not hide behind a step."""
    leak = [32.0 * requests + (8192.0 if requests >= 480 else 0.0) for requests in REQUESTS]
    assert late_growth_kib(_with(leak)) > SOAK_RSS_GROWTH_KIB


def test_too_few_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="too few"):
        late_growth_kib(RSS_KIB[:5])
