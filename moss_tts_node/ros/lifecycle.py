"""What the managed node does in each lifecycle state (docs/ros.md, "Lifecycle"): which requests and parameter changes
it takes, why it refuses the others, and how the loaded model is shared until cleanup frees it.

Pure (no node), so the rules are tested without a middleware (``test/test_ros_lifecycle_rules.py``); node.py
calls them from its transition callbacks and request callbacks.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from moss_tts_node.errors import MossTTSError
from moss_tts_node.ros.parameters import ALL_OPTIONS, load_time

# How the requests in line end when the node leaves the active state, and how those that arrive then are refused.
DEACTIVATING = "the node is deactivating"
SHUTTING_DOWN = "the node is shutting down"


class Phase(str, enum.Enum):
    """The node's lifecycle state, by the labels ``ros2 lifecycle get`` prints."""

    UNCONFIGURED = "unconfigured"
    CONFIGURING = "configuring"
    INACTIVE = "inactive"
    ACTIVATING = "activating"
    ACTIVE = "active"
    DEACTIVATING = "deactivating"
    CLEANING_UP = "cleaningup"
    SHUTTING_DOWN = "shuttingdown"
    FINALIZED = "finalized"
    ERROR_PROCESSING = "errorprocessing"

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory: from a successful configure until cleanup (or shutdown)."""
        return self in (Phase.INACTIVE, Phase.ACTIVATING, Phase.ACTIVE, Phase.DEACTIVATING)


class ConfigureFailed(MossTTSError):
    """Configuring (parameters checked, model loaded, voice prepared) failed; ``str()`` is the reason."""


def request_refusal(phase: Phase, node: str) -> str | None:
    """Why a request is refused in ``phase`` (None: it is served), with the way to a node that serves.

    ``node`` is the node's full name, as the ``ros2 lifecycle set`` command in the reason needs it.
    """
    if phase is Phase.ACTIVE:
        return None
    if phase is Phase.DEACTIVATING:
        return DEACTIVATING
    if phase in (Phase.SHUTTING_DOWN, Phase.FINALIZED):
        return SHUTTING_DOWN
    if phase.loaded:
        return f"the node is inactive: it serves once activated (ros2 lifecycle set {node} activate)"
    return (
        f"the node is {phase.value}: it serves once configured and activated "
        f"(ros2 lifecycle set {node} configure, then activate)"
    )


def voices_refusal(phase: Phase, node: str) -> str:
    """Why ``~/list_voices`` has no voices in ``phase``, a state without a model: they are encoded on configure."""
    if phase in (Phase.SHUTTING_DOWN, Phase.FINALIZED):
        return SHUTTING_DOWN
    return (
        f"the node is {phase.value}: its voices are encoded when it is configured (ros2 lifecycle set {node} configure)"
    )


def parameter_refusal(names: Iterable[str], phase: Phase, node: str) -> str | None:
    """Why changing these parameters is refused in ``phase`` (None: it may change): a load-time one may change
    only while no model is loaded, and the reason gives the transitions that lead there and back."""
    held = [name for name in names if name in ALL_OPTIONS and load_time(ALL_OPTIONS[name])]
    if not held or phase is Phase.UNCONFIGURED:
        return None
    if phase is Phase.ACTIVE:
        way = f"deactivate and clean it up first (ros2 lifecycle set {node} deactivate, then cleanup)"
    elif phase is Phase.INACTIVE:
        way = f"clean it up first (ros2 lifecycle set {node} cleanup)"
    else:
        way = "once it is unconfigured"
    quoted = ", ".join(f"'{name}'" for name in held)
    verb, it, changes = ("is", "it", "it changes") if len(held) == 1 else ("are", "them", "they change")
    return (
        f"{quoted} {verb} read when the model loads, so {changes} only while the node is unconfigured, and the "
        f"node is {phase.value}: {way}, set {it}, then configure and activate"
    )


Lent = TypeVar("Lent")


class Loan(Generic[Lent]):
    """The loaded model, lent to the threads that use it outside the line of requests (a request being
    checked, a voice being prepared) and taken back only once every loan has ended: cleanup never frees a
    model that a callback is still running on."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._item: Lent | None = None
        self._loans = 0

    def give(self, item: Lent) -> None:
        with self._changed:
            self._item = item

    @contextmanager
    def borrow(self) -> Iterator[Lent | None]:
        """The item for the duration of the block, or None when none is given (not loaded, or being freed)."""
        with self._changed:
            item = self._item
            self._loans += 1
        try:
            yield item
        finally:
            with self._changed:
                self._loans -= 1
                self._changed.notify_all()

    def take_back(self) -> Lent | None:
        """Lend the item no more, wait for the loans under way to end, and return it (None if none was given)."""
        with self._changed:
            item, self._item = self._item, None
            self._changed.wait_for(lambda: self._loans == 0)
        return item
