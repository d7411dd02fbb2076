"""What the managed node does in each lifecycle state (docs/ros.md, "Lifecycle"): which requests and parameter changes
it takes, why it refuses the others, and how the loaded model is shared until cleanup frees it.

Pure (no node), so the rules are tested without a middleware (``test/test_ros_lifecycle_rules.py``); node.py
calls them from its transition and parameter callbacks, ros/requests.py from a request's check.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar

from moss_tts_node.errors import ConfigError, MossTTSError
from moss_tts_node.ros.parameters import ALL_OPTIONS, checked_settings, checked_values, load_time
from moss_tts_node.serving.queue import Refused

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


def check_serving(phase: Phase, node: str) -> None:
    """Raise Refused unless the node serves requests in ``phase``, with the way to a node that serves.

    ``node`` is the node's full name, as the ``ros2 lifecycle set`` command in the reason needs it.
    """
    if phase is Phase.ACTIVE:
        return
    if phase is Phase.DEACTIVATING:
        raise Refused(DEACTIVATING)
    if phase in (Phase.SHUTTING_DOWN, Phase.FINALIZED):
        raise Refused(SHUTTING_DOWN)
    if phase.loaded:
        raise Refused(f"the node is inactive: it serves once activated (ros2 lifecycle set {node} activate)")
    raise Refused(
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


def change_refusal(
    changed: Mapping[str, Any], values: Mapping[str, Any], phase: Phase, node: str, source: str
) -> str | None:
    """Why this change of parameters is refused in ``phase`` (None: it may change), ``values`` being every
    parameter now: a load-time one only while no model is loaded (``parameter_refusal``); then, with no model
    loaded, each value alone (the whole set is checked at configure, so parameters that are wrong together can be
    fixed one at a time), and with a model loaded the whole set as it would be. ``source`` begins a reason."""
    refusal = parameter_refusal(changed, phase, node)
    if refusal is not None:
        return refusal
    try:
        if phase.loaded:
            checked_settings({**values, **changed}, source, Path.cwd())
        else:
            checked_values(changed, source)
    except ConfigError as err:
        return str(err)
    return None


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
