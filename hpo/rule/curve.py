"""`CurveView`: one trial's reported curve as the judge reads it, grown one report at a time.

Both adapters keep one per trial between two judgements (issue 22, "one curve cache"): the Optuna pruner's
``_Known`` (hpo/optuna_side/pruner.py) and the Ray scheduler's ``_ViewCache`` (hpo/ray_side/scheduler.py).
What each adapter reads from its backend (which reports are new, the controls, the decision log) stays
with it; the curve and its cleaned-report summary (``judge.ReportSummary``) live here, so that a report
costs the same at any curve length and a judgement converts nothing.
"""

from __future__ import annotations

import bisect

import numpy as np

from collapse_hpo.hpo.rule.reports import ReportSummary

__all__ = ["CurveView"]


class CurveView:
    """A trial's reports: ``steps`` (a list, in the backend's units), ``t_hat`` and ``loss`` (float arrays,
    views valid until the next change), and ``summary``, the reports cleaned as ``judge.clean_reports``
    would clean them in the order they were added.

    Example::

        curve = CurveView()
        curve.add(100, 0.1, 3.2)
        curve.add(200, 0.2, 2.9)
        TrialView(0, "running", curve.steps, curve.t_hat, curve.loss, reports=curve.summary.reports())
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every report."""
        self.steps: list[float] = []
        self._t = np.empty(64)  # grown by doubling
        self._y = np.empty(64)
        self.summary = ReportSummary()

    def __len__(self) -> int:
        return len(self.steps)

    @property
    def t_hat(self) -> np.ndarray:
        """The reports' t̂ (a view of the curve: valid until the next ``add``, ``append`` or ``clear``)."""
        return self._t[: len(self.steps)]

    @property
    def loss(self) -> np.ndarray:
        """The reported losses (a view, like ``t_hat``)."""
        return self._y[: len(self.steps)]

    def append(self, step: float, t_hat: float, loss: float) -> None:
        """Add a report at the end, whatever its step (a backend whose reports come in order)."""
        n = len(self.steps)
        self._room(n + 1)
        self.steps.append(step)
        self._t[n], self._y[n] = t_hat, loss
        self.summary.add(t_hat, loss)

    def add(self, step: float, t_hat: float, loss: float) -> None:
        """Add a report keeping ``steps`` sorted: at the end when its step is not below the last one, else
        (rare: reports out of order) inserted at its place, O(curve)."""
        if not self.steps or step >= self.steps[-1]:
            self.append(step, t_hat, loss)
            return
        n = len(self.steps)
        self._room(n + 1)
        i = bisect.bisect(self.steps, step)
        self.steps.insert(i, step)
        self._t[i + 1: n + 1] = self._t[i:n].copy()
        self._y[i + 1: n + 1] = self._y[i:n].copy()
        self._t[i], self._y[i] = t_hat, loss
        self.summary.add(t_hat, loss)

    def _room(self, n: int) -> None:
        if n > self._t.size:
            size = max(n, 2 * self._t.size)
            self._t = np.resize(self._t, size)
            self._y = np.resize(self._y, size)
