"""The scheduler's checkpoint signal, held until the trainer is between steps.

submitit handles SIGUSR2 (preemption, time limit) by calling ``TrialTask.checkpoint`` at once, in
whatever bytecode the main thread is running. A researcher's model is mutable mid-step, so its
state is taken only at a step boundary: while a trainer runs, the signal is recorded and delivered
to submitit's own handler at the next boundary (``deliver``). A step must therefore be shorter than
the launcher's ``signal_delay_s``.

The handler it delivers to is the toolkit's own (submitit's checkpoint and ``scontrol requeue``):
``toolkit_handlers`` wraps it once the process is fenced, so that its programs run inside the
fence's ``toolkit_programs`` (the trainer code it calls back goes behind ``trainer_code`` again).

Must not: decide anything about the attempt; it only moves the moment the handler runs.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from parcel_hpc import fence

HELD = (signal.SIGUSR2,)


class StepBoundarySignals:
    """A context in which ``HELD`` signals wait for ``deliver``; on exit the old handlers return."""

    def __init__(self, signums: tuple[signal.Signals, ...] = HELD) -> None:
        self.signums = signums
        self.previous: dict[int, Any] = {}
        self.pending: list[int] = []

    def __enter__(self) -> StepBoundarySignals:
        if threading.current_thread() is threading.main_thread():  # only the main thread may set handlers
            for signum in self.signums:
                self.previous[signum] = signal.getsignal(signum)
                signal.signal(signum, self._hold)
        return self

    def _hold(self, signum: int, frame: FrameType | None) -> None:
        self.pending.append(signum)

    def deliver(self) -> None:
        """At a step boundary: hand the held signal to the handler that was there before (once:
        repeats collapse, as pending Unix signals do); from then on signals go to it directly."""
        if not self.pending or not self.previous:
            return
        signum = self.pending[0]
        self.pending.clear()
        handler = self.previous[signum]
        self._restore()  # submitit's handler may exit the process or raise
        if callable(handler):
            handler(signum, None)
        elif handler is not signal.SIG_IGN:
            signal.raise_signal(signum)  # the default action, as if never held

    def __exit__(self, *exc: object) -> None:
        # A signal still pending here (it came after the last step boundary) stays in ``pending``:
        # handing it on now would run the checkpoint handler before the attempt recorded its ending.
        self._restore()

    def _restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)
        self.previous = {}


def toolkit_handlers(signums: tuple[signal.Signals, ...] = HELD) -> None:
    """Wrap the handlers installed for ``signums`` (submitit's) so that they run inside the fence's
    ``toolkit_programs``; once: a wrapped handler is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers, and only it runs them
    for signum in signums:
        handler = signal.getsignal(signum)
        if callable(handler) and not isinstance(handler, _Toolkit):
            signal.signal(signum, _Toolkit(handler))


class _Toolkit:
    """A signal handler of the toolkit's, run where it may start its programs."""

    def __init__(self, handler: Callable[[int, FrameType | None], Any]) -> None:
        self.handler = handler

    def __call__(self, signum: int, frame: FrameType | None) -> Any:
        with fence.toolkit_programs():
            return self.handler(signum, frame)
