"""The scheduler's signal is held while a trainer steps and handed on at the step boundary."""

import os
import signal

import pytest

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


def test_a_signal_still_held_when_the_attempt_leaves_early_reaches_the_previous_handler():
    """A pruned or failed trial leaves the context between boundaries: the job's warning must not be
    lost with it (a packed job still has to checkpoint and requeue)."""
    seen = []
    original = signal.signal(signal.SIGUSR2, lambda signum, frame: seen.append(signum))
    try:
        with pytest.raises(RuntimeError), StepBoundarySignals():
            os.kill(os.getpid(), signal.SIGUSR2)
            assert seen == []  # held
            raise RuntimeError("pruned")
        assert seen == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, original)
