"""Stopping a sweep from outside: Ctrl-C (SIGINT), SIGTERM and SIGHUP all stop it the same way.

SIGTERM is how job schedulers, systemd and Kubernetes stop a job; SIGHUP comes when its terminal goes away.
A driver that gets one of them while it holds the sweep's lease (`hpo.sweep.runner.run_sweep`) stops cleanly:

1. the first signal only records itself (`SweepStop.signum`); Ray Tune is told through the public
   ``tune.stopper.Stopper`` of its run config (`SweepStop.stopper`), which ends the run at its next step,
   and no new trial is asked;
2. the trials that were running are marked FAIL ``interrupted`` (not counted as an attempt: `resume` reruns
   them from the start), the lease is released, the report is printed, and one line on stderr says what
   happened; the exit status is 128 + the signal's number (130, 143, 129), as a shell reports it.

A storage fault (a full disk: `hpo.sweep.storage_errors`) stops the sweep the same way (`SweepStop.fault`),
with no signal: every trial would hit it, and none is charged an attempt for it.

A second signal stops at once (`Interrupted`, a ``KeyboardInterrupt``): the trials are still marked
interrupted and the lease released on the way out. Outside the lease (reading the file, the report), a
signal raises `Interrupted` at once.

Why handlers of our own: Ray installs a SIGTERM handler when it starts and its C++ core then dumps its stack
and aborts the driver (SIGABRT) on SIGTERM, leaving the trials RUNNING; Ray Tune's own SIGINT handler stops
the run but lets the driver exit 0. `install` is called again after every ``ray.init``.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

#: The signals that stop a sweep.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def stopped_line(signum: int, source: object) -> str:
    """The one line a sweep stopped by signal ``signum`` ends with (``source``: its sweep file)."""
    return (f"stopped by {signal_name(signum)}: the trials that were running are marked interrupted and the "
            f"lease is released; `collapse-hpo resume {source}` continues the sweep")


class Interrupted(KeyboardInterrupt):
    """The process was stopped by signal ``signum`` (exit status 128 + ``signum``)."""

    def __init__(self, signum: int, message: str | None = None) -> None:
        super().__init__(message or f"interrupted by {signal_name(signum)}")
        self.signum = signum
        self.message = message or f"interrupted by {signal_name(signum)}"


class SweepStop:
    """The stop requests of this process's driver (one per process: signal handlers are per process)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.last_signum: int | None = None  # the latest signal handled (a second one raises)
        self.fault: str | None = None  # a storage fault (hpo/sweep/storage_errors.py) that stops the sweep
        self._deferring = False

    @property
    def requested(self) -> bool:
        """Whether a signal asked the sweep to stop."""
        return self.signum is not None

    @property
    def stopping(self) -> bool:
        """Whether the sweep is stopping: a signal, or a storage fault (a full disk) that every trial would
        hit. Either way no new trial starts and the running ones are marked interrupted."""
        return self.signum is not None or self.fault is not None

    def _handle(self, signum: int, _frame: Any) -> None:
        self.last_signum = signum
        if self._deferring and self.signum is None:
            self.signum = signum  # stop at the next step of Ray Tune; nothing else runs in a handler
            return
        raise Interrupted(signum)

    def interrupted(self, err: KeyboardInterrupt) -> Interrupted:
        """``err`` as an `Interrupted` naming the signal: Ray may re-raise the `Interrupted` our handler
        raised as a plain ``KeyboardInterrupt`` (exit status 130 whatever the signal)."""
        if isinstance(err, Interrupted):
            return err
        return Interrupted(self.last_signum or signal.SIGINT)

    def install(self) -> None:
        """(Re)install the handlers of `STOP_SIGNALS` (main thread only; Python allows no other)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    @contextlib.contextmanager
    def handling(self) -> Iterator[SweepStop]:
        """Handle `STOP_SIGNALS` for the block (a driver's `run_sweep`), restoring the previous handlers."""
        main = threading.current_thread() is threading.main_thread()
        previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} if main else {}
        self.signum = None
        self.last_signum = None
        self.fault = None
        self.install()
        try:
            yield self
        finally:
            self._deferring = False
            for sig, handler in previous.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """In the block (the lease held), the first signal is recorded and the sweep stops at its next step;
        a second one raises `Interrupted`."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def stopper(self, on_stop: Callable[[str], None] | None = None) -> Any:
        """A ``ray.tune.stopper.Stopper`` that ends the whole Tune run once it is `stopping`; ``on_stop``
        is called once then with a line saying so (from Ray Tune's loop, not from the signal handler)."""
        from ray.tune.stopper import Stopper

        stop = self
        told: list[bool] = []

        class SignalStopper(Stopper):
            def __call__(self, trial_id: str, result: dict) -> bool:
                return False

            def stop_all(self) -> bool:
                if stop.stopping and on_stop is not None and not told:
                    told.append(True)
                    if stop.signum is not None:
                        on_stop(f"stopping: {signal_name(stop.signum)} received; the running trials will be "
                                "marked interrupted (send it again to stop at once)")
                    else:
                        on_stop(f"stopping: {stop.fault}; the running trials will be marked interrupted")
                return stop.stopping

        return SignalStopper()

#: This process's stop requests.
STOP = SweepStop()
