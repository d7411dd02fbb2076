"""ros/lifecycle.py and ros/heap.py without a middleware: what each lifecycle state refuses and why, which
parameter changes wait for an unconfigured node, the loan that keeps cleanup from freeing a model in use, and
the one malloc heap the node process gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from ros_helpers import require_ros

require_ros()

from moss_tts_node.ros.heap import release_freed_memory, resident_mib  # noqa: E402
from moss_tts_node.ros.lifecycle import (  # noqa: E402
    DEACTIVATING,
    SHUTTING_DOWN,
    Loan,
    Phase,
    check_serving,
    parameter_refusal,
)
from moss_tts_node.serving.queue import Refused  # noqa: E402

NODE = "/robot1/moss_tts_node"


def refusal(phase: Phase) -> str | None:
    """Why a request is refused in ``phase``; None when it is served."""
    try:
        check_serving(phase, NODE)
    except Refused as refused:
        return str(refused)
    return None


def test_only_an_active_node_serves_and_the_others_say_how_to_get_there() -> None:
    assert refusal(Phase.ACTIVE) is None
    assert refusal(Phase.DEACTIVATING) == DEACTIVATING == "the node is deactivating"
    assert refusal(Phase.SHUTTING_DOWN) == refusal(Phase.FINALIZED) == SHUTTING_DOWN
    inactive = "the node is inactive: it serves once activated (ros2 lifecycle set /robot1/moss_tts_node activate)"
    assert refusal(Phase.INACTIVE) == refusal(Phase.ACTIVATING) == inactive
    for phase in (Phase.UNCONFIGURED, Phase.CONFIGURING, Phase.CLEANING_UP, Phase.ERROR_PROCESSING):
        assert refusal(phase) == (
            f"the node is {phase.value}: it serves once configured and activated "
            "(ros2 lifecycle set /robot1/moss_tts_node configure, then activate)"
        )


def test_the_model_is_loaded_from_configure_to_cleanup() -> None:
    loaded = {phase for phase in Phase if phase.loaded}
    assert loaded == {Phase.INACTIVE, Phase.ACTIVATING, Phase.ACTIVE, Phase.DEACTIVATING}
    assert [phase.value for phase in Phase] == [  # the labels ros2 lifecycle prints
        "unconfigured",
        "configuring",
        "inactive",
        "activating",
        "active",
        "deactivating",
        "cleaningup",
        "shuttingdown",
        "finalized",
        "errorprocessing",
    ]


def test_a_load_time_parameter_waits_for_an_unconfigured_node() -> None:
    for phase in Phase:
        assert parameter_refusal(["sampling.seed", "queue_policy", "text_stream_max_open"], phase, NODE) is None
        assert parameter_refusal(["queue_size", "autostart"], phase, NODE) is None  # read-only: rclpy refuses them
        assert parameter_refusal(["not.a.parameter"], phase, NODE) is None  # rclpy refuses it as undeclared
    assert parameter_refusal(["llama.n_ctx", "model.weights_dir"], Phase.UNCONFIGURED, NODE) is None
    assert parameter_refusal(["llama.n_ctx"], Phase.ACTIVE, NODE) == (
        "'llama.n_ctx' is read when the model loads, so it changes only while the node is unconfigured, and the "
        "node is active: deactivate and clean it up first (ros2 lifecycle set /robot1/moss_tts_node deactivate, "
        "then cleanup), set it, then configure and activate"
    )
    names = ["sampling.seed", "generation.reference_audio", "audio.backend"]
    assert parameter_refusal(names, Phase.INACTIVE, NODE) == (
        "'generation.reference_audio', 'audio.backend' are read when the model loads, so they change only while "
        "the node is unconfigured, and the node is inactive: clean it up first (ros2 lifecycle set "
        "/robot1/moss_tts_node cleanup), set them, then configure and activate"
    )
    assert "the node is finalized: once it is unconfigured" in (
        parameter_refusal(["llama.n_ctx"], Phase.FINALIZED, NODE) or ""
    )


def test_the_model_is_taken_back_only_once_every_loan_has_ended() -> None:
    loan: Loan[str] = Loan()
    with loan.borrow() as nothing:
        assert nothing is None  # nothing given yet
    loan.give("model")
    borrowed, release, taken = threading.Event(), threading.Event(), []

    def borrower() -> None:
        with loan.borrow() as item:
            assert item == "model"
            borrowed.set()
            release.wait()

    holder = threading.Thread(target=borrower)
    holder.start()
    borrowed.wait()
    taker = threading.Thread(target=lambda: taken.append(loan.take_back()))
    taker.start()
    while True:  # until the taker has begun: it lends no more
        with loan.borrow() as item:
            if item is None:
                break
    assert taker.is_alive() and not taken  # it waits for the loan under way
    release.set()
    holder.join()
    taker.join()
    assert taken == ["model"]
    assert loan.take_back() is None


def test_the_freed_memory_is_measured_and_trimmed() -> None:
    before = resident_mib()
    assert before is not None and before > 0
    release_freed_memory()  # collects and trims; nothing to assert but that it runs where glibc is
    assert resident_mib() is not None


HEAPS = """
import ctypes, json, os, re, sys, tempfile, threading
import moss_tts_node.ros.heap
import rclpy  # starts threads of its own
def work():
    kept = [bytearray(2000) for _ in range(2000)]
threads = [threading.Thread(target=work) for _ in range(6)]
[t.start() for t in threads]
[t.join() for t in threads]
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
path = tempfile.mktemp()
out = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(out))
libc.fclose(ctypes.c_void_p(out))
print(json.dumps(len(re.findall('<heap nr=', open(path).read()))))
os.unlink(path)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's heaps are Linux's")
def test_the_node_process_allocates_from_one_heap_unless_the_environment_says_otherwise() -> None:
    def heaps(env: dict[str, str]) -> int:
        run = subprocess.run([sys.executable, "-c", HEAPS], capture_output=True, text=True, env=env, check=True)
        return json.loads(run.stdout.splitlines()[-1])

    environment = {key: value for key, value in os.environ.items() if key != "MALLOC_ARENA_MAX"}
    assert heaps(environment) == 1
    assert heaps(environment | {"MALLOC_ARENA_MAX": "8"}) > 1  # what glibc does by itself: a heap per thread
