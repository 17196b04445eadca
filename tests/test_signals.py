"""The scheduler's signal is held while a trainer steps and handed on at the step boundary."""

import os
import signal

import pytest

from parcel_hpc.trainer.run import Stop
from parcel_hpc.worker.attempt import StopAttempt, StopReason
from parcel_hpc.worker.signals import StepBoundarySignals


def test_usr2_waits_for_the_step_boundary_then_reaches_the_previous_handler():
    seen = []
    original = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        with StepBoundarySignals() as held:
            os.kill(os.getpid(), signal.SIGUSR2)
            os.kill(os.getpid(), signal.SIGUSR2)
            assert seen == [] and held.pending  # mid-step: nothing ran
            held.deliver()
            assert seen == [signal.SIGUSR2]  # once: repeats collapse, as pending Unix signals do
            os.kill(os.getpid(), signal.SIGUSR2)  # after delivery the old handler answers directly
            assert seen == [signal.SIGUSR2] * 2
        held.deliver()  # nothing pending: nothing happens
        assert seen == [signal.SIGUSR2] * 2
    finally:
        signal.signal(signal.SIGUSR2, original)


def test_leaving_the_context_restores_the_handler_without_delivering():
    seen = []
    handler = lambda signum, frame: seen.append(signum)  # noqa: E731
    original = signal.signal(signal.SIGUSR2, handler)
    try:
        with StepBoundarySignals():
            assert signal.getsignal(signal.SIGUSR2) is not handler
        assert signal.getsignal(signal.SIGUSR2) is handler and seen == []
    finally:
        signal.signal(signal.SIGUSR2, original)


def test_a_signal_that_came_after_the_last_boundary_stays_pending_for_the_task():
    """Handing it on while the attempt leaves would run the checkpoint handler before the attempt
    recorded its ending (a finished trial requeued): it stays in ``pending``, and a packed task
    raises it once the attempt's ending is on disk (``TrialTask.__call__``)."""
    seen = []
    handler = lambda signum, frame: seen.append(signum)  # noqa: E731
    original = signal.signal(signal.SIGUSR2, handler)
    try:
        held = StepBoundarySignals()
        with pytest.raises(RuntimeError), held:
            os.kill(os.getpid(), signal.SIGUSR2)
            raise RuntimeError("pruned")
        assert seen == [] and held.pending == [signal.SIGUSR2]
        assert signal.getsignal(signal.SIGUSR2) is handler
    finally:
        signal.signal(signal.SIGUSR2, original)


def test_a_stop_a_loop_returned_on_is_the_attempts_reason_and_back():
    for stop in (Stop.PRUNED, Stop.CANCELLED, Stop.QUARANTINED, Stop.REJECTED):
        assert StopReason.of(stop).stop() is stop and StopReason.of(stop).value == stop.value
    with pytest.raises(KeyError):
        StopReason.of(Stop.REQUEUE)  # the loop saved and goes on: not a stop without a result
    assert StopAttempt(StopReason.SUPERSEDED).reason is StopReason.SUPERSEDED
