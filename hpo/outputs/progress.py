"""Progress of a running sweep: one line per event (trial started, pruned, complete, failed) with a summary.

The summary says how many trials are running, pruned, complete and failed, the best final loss so far and the
compute spent in tokens against the unpruned total (every planned trial trained to its end)::

    [00:42] trial 5 pruned at t_hat=0.31 (predicted 3.412 [3.39, 3.43]) | run 2 prn 2 done 3 fail 0 |
            best 3.215 (#1) | tokens 8.1M / 24.0M (34%)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from collapse_hpo.predictors.misfit import prediction_text


def human_tokens(n: float) -> str:
    """Token counts as 950, 12.3K, 4.1M, 2.0B."""
    n = float(n)
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def trained_tokens(trial: Any) -> float:
    """Tokens a stored trial trained: its ``tokens_trained``, else its last report's step (tokens)."""
    tokens = trial.user_attrs.get("tokens_trained")
    if tokens is None and trial.intermediate_values:
        tokens = max(trial.intermediate_values)
    return float(tokens or 0)


def _fmt_params(params: dict[str, Any]) -> str:
    parts = []
    for k, v in params.items():
        parts.append(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}")
    return " ".join(parts)


@dataclass
class Progress:
    """Counts and compute of a sweep, printed one line per event.

    Args:
        unpruned_tokens: tokens of the planned trials trained to the end (the compute without pruning).
        out: where lines go (None: the current ``sys.stdout``); ``clock`` gives seconds (tests pass a fake).
            Ray Tune pickles the searcher that holds this object: the stream is not pickled (None in a copy).
        spent_before: tokens already spent by trials of an earlier (interrupted) run of the sweep.
    """

    unpruned_tokens: float
    out: TextIO | None = None
    clock: Callable[[], float] = time.monotonic
    spent_before: float = 0.0
    running: dict[int, float] = field(default_factory=dict)
    finished_tokens: float = 0.0
    counts: dict[str, int] = field(default_factory=lambda: {"PRUNED": 0, "COMPLETE": 0, "FAIL": 0})
    best: tuple[float, int] | None = None
    t0: float = field(default=0.0)

    def __post_init__(self) -> None:
        self.t0 = self.clock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["out"] = None
        return state

    @property
    def spent(self) -> float:
        """Tokens trained so far: finished trials, the latest report of running ones, earlier runs."""
        return self.spent_before + self.finished_tokens + sum(self.running.values())

    def seed_from(self, trials: list[Any]) -> None:
        """Count the finished trials (optuna FrozenTrials) of an earlier run of this sweep."""
        for t in trials:
            state = t.state.name
            if state in self.counts:
                self.counts[state] += 1
                self.spent_before += float(t.user_attrs.get("tokens_trained", 0) or 0)
                if state == "COMPLETE" and t.value is not None:
                    self._update_best(float(t.value), t.number)

    def seed_spent(self, trials: list[Any]) -> None:
        """Count the tokens of trials an earlier run of this sweep trained and left unfinished (interrupted:
        rerun, so not counted as failed), as the report's compute line counts them."""
        for t in trials:
            self.spent_before += trained_tokens(t)

    def _update_best(self, value: float, number: int) -> None:
        if self.best is None or value < self.best[0]:
            self.best = (value, number)

    def summary(self) -> str:
        """The state of the sweep in one line."""
        c = self.counts
        best = f"best {self.best[0]:.4f} (#{self.best[1]})" if self.best else "best -"
        frac = self.spent / self.unpruned_tokens if self.unpruned_tokens > 0 else 0.0
        return (f"running {len(self.running)} pruned {c['PRUNED']} complete {c['COMPLETE']}"
                f" failed {c['FAIL']}"
                f" | {best} | tokens {human_tokens(self.spent)} / {human_tokens(self.unpruned_tokens)}"
                f" ({100 * frac:.0f}%)")

    def _line(self, text: str) -> None:
        elapsed = int(self.clock() - self.t0)
        stamp = f"[{elapsed // 60:02d}:{elapsed % 60:02d}]"
        print(f"{stamp} {text} | {self.summary()}", file=self.out or sys.stdout, flush=True)

    def started(self, number: int, params: dict[str, Any], note: str = "") -> None:
        """A trial was handed to Ray."""
        self.running[number] = 0.0
        self._line(f"trial {number} started {_fmt_params(params)}{note}")

    def result(self, number: int, tokens: float) -> None:
        """A running trial reported ``tokens`` tokens seen (no line printed)."""
        if number in self.running:
            self.running[number] = float(tokens)

    def finished(self, trial: Any) -> None:
        """A trial ended (an optuna FrozenTrial in its final state)."""
        seen = self.running.pop(trial.number, 0.0)
        state = trial.state.name
        attrs = trial.user_attrs
        # a trial stopped with the sweep may carry no count of its own: what it reported was still trained
        self.finished_tokens += max(float(attrs.get("tokens_trained", 0) or 0), seen)
        if state in self.counts:
            self.counts[state] += 1
        if state == "COMPLETE" and trial.value is not None:
            self._update_best(float(trial.value), trial.number)
            text = f"trial {trial.number} complete final_loss={trial.value:.4f}"
        elif state == "PRUNED":
            pred = attrs.get("predicted_final_loss")
            lo, hi = attrs.get("predicted_low"), attrs.get("predicted_high")
            frac = attrs.get("decision_fraction")
            where = f" at t_hat={frac:.2f}" if isinstance(frac, int | float) else ""
            if isinstance(pred, int | float):
                both = isinstance(lo, int | float) and isinstance(hi, int | float)
                mis = attrs.get("predicted_misfit")
                shown = prediction_text(float(pred), lo if both else None, hi if both else None,
                                        float(mis) if isinstance(mis, int | float) else None)
                text = f"trial {trial.number} pruned{where} ({shown})"
            else:
                reason = attrs.get("prune_reason", "no reason recorded")
                text = f"trial {trial.number} pruned{where} ({reason})"
        else:
            err = str(attrs.get("error", "no error recorded")).splitlines()[0][:160]
            text = f"trial {trial.number} {state.lower()}: {err}"
        self._line(text)

    def note(self, text: str) -> None:
        """Any other event (a retry, a stale trial rerun)."""
        self._line(text)
