"""The ``~/speak`` action's goals: each accepted, checked and put in line in the order the goals came, given
feedback as its request moves, and ended succeeded, canceled or aborted with its request's reason
(docs/design.md, "Threads").

The node wires these methods as the action server's callbacks, in a mutually exclusive group of their own: rclpy
answers a goal request before ``accept`` runs, so without the group a client's next goal could overtake it;
``accept`` hands the goal to the intake (ros/requests.py) before the next goal or a cancel is looked at, and
``execute`` runs as a task of its own, waiting for the goal's check, then for its request's end. A goal refused
before its turn (a bad request, a full line) is accepted all the same and aborted with the reason: a rejected
goal cannot say why. No node: ``test/test_ros_requests.py`` drives it with stand-ins for rclpy's goal handles.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial

from moss_tts_msgs.action import Speak
from rclpy.action import CancelResponse
from rclpy.action.server import ServerGoalHandle

from moss_tts_node.ros.messages import speak_feedback, timing_message
from moss_tts_node.ros.requests import CLIENT_CANCEL, Job, Requests
from moss_tts_node.serving.queue import Refused, Ticket

# rclpy marks a goal canceling just after ``cancel`` returns, and the request may end before that; ``execute``
# waits for the mark, up to this bound (rclpy sets it a few statements after the return).
CANCELING_MARK_WAIT_S = 1.0
CANCELING_MARK_POLL_S = 0.001


@dataclass
class _Goal:
    check: Future[Ticket[Job]]  # its check, then its place in line, or its refusal
    client_canceled: bool = False  # its client's cancel was accepted


class SpeakGoals:
    """The Speak goals from their acceptance to their result."""

    def __init__(self, requests: Requests) -> None:
        self._requests = requests
        self._goals: dict[str, _Goal] = {}

    def accept(self, goal_handle: ServerGoalHandle) -> None:
        """Hand an accepted goal to the intake, which checks it and puts it in line in the order the goals came;
        then execute it."""
        goal_id = _goal_id(goal_handle)
        feedback = partial(_publish_feedback, goal_handle)
        self._goals[goal_id] = _Goal(self._requests.speak(goal_handle.request, goal_id, feedback))
        goal_handle.execute()

    def cancel(self, goal_handle: ServerGoalHandle) -> CancelResponse:
        """Accept every cancel: the goal leaves the line now, or stops within one generation step; one still
        being checked does so as soon as it is in line, and a refused one ends as it would."""
        goal = self._goals.get(_goal_id(goal_handle))
        if goal is not None:
            goal.check.add_done_callback(partial(self._cancel_checked, goal))
        return CancelResponse.ACCEPT

    def execute(self, goal_handle: ServerGoalHandle) -> Speak.Result:
        """Wait for the goal's check, then for its request's end; its result, and its terminal state set."""
        goal_id = _goal_id(goal_handle)
        with self._requests.answering():
            goal = self._goals[goal_id]
            try:
                ticket = goal.check.result()
            except Refused as refusal:
                result = Speak.Result(success=False, message=str(refusal), timing=timing_message(None, None))
                goal_handle.abort()
            else:
                outcome = ticket.wait()
                assert outcome is not None
                job = ticket.job
                result = Speak.Result(
                    success=outcome.success,
                    message=outcome.message,
                    duration=job.audio_s,
                    timing=timing_message(job.stream.report, job.queue_wait_s),
                )
                if outcome.success:
                    goal_handle.succeed()
                elif _marked_canceling(goal_handle, goal.client_canceled):
                    goal_handle.canceled()
                else:
                    goal_handle.abort()
            del self._goals[goal_id]  # after the terminal state: no cancel can come for it now
            return result

    def _cancel_checked(self, goal: _Goal, check: Future[Ticket[Job]]) -> None:
        """What a client's cancel does to its goal once the goal's check is done: nothing to a refused one."""
        if check.exception() is None:
            goal.client_canceled = True  # before the request can end by it
            self._requests.cancel(check.result(), CLIENT_CANCEL)


def _goal_id(goal_handle: ServerGoalHandle) -> str:
    """A goal's UUID in hex: the request_id of its AudioChunk messages."""
    return bytes(goal_handle.goal_id.uuid).hex()


def _marked_canceling(goal_handle: ServerGoalHandle, client_canceled: bool) -> bool:
    """Whether a goal that did not succeed ends as canceled: rclpy has marked it canceling. When its client's
    cancel was accepted, the mark follows at once (it is the only state a goal may be canceled from), so wait
    for it: without it the goal would end aborted though the client asked, and was told yes."""
    deadline = time.monotonic() + CANCELING_MARK_WAIT_S
    while client_canceled and not goal_handle.is_cancel_requested and time.monotonic() < deadline:
        time.sleep(CANCELING_MARK_POLL_S)
    return goal_handle.is_cancel_requested


def _publish_feedback(goal_handle: ServerGoalHandle, ticket: Ticket[Job]) -> None:
    goal_handle.publish_feedback(speak_feedback(ticket.state, ticket.ahead, ticket.job.audio_s, ticket.job.chunks))
