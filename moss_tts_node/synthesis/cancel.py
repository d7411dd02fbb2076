"""A request's cancel flag, as every synthesizer takes it (the local model's and the remote backend's)."""

from __future__ import annotations

import threading
from collections.abc import Callable

# A threading.Event, or any callable that says whether to stop; None never stops.
CancelFlag = threading.Event | Callable[[], bool] | None


def cancel_check(cancel: CancelFlag) -> Callable[[], bool]:
    """``cancel`` as a callable that says whether to stop now."""
    if cancel is None:
        return lambda: False
    if isinstance(cancel, threading.Event):
        return cancel.is_set
    return cancel
