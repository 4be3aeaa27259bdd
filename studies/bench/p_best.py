"""The risk of cutting the winner as the rule's one knob: prune a trial when its probability of ending the
best is below α (issue 20, item 1's "the risk of cutting the winner" and item 2's "a margin calibrated ...
(conformal or Bayesian) ... with a stated, checked bound on how often the winner is cut"). Measured, not
built.

Each trial's final log loss is modelled as its log loss at its fraction f less the median drop from f to
the end, with a normal error whose standard deviation is the spread of that drop (both per report fraction,
learned on the *other* nights of ``../shared/extdata/surestop_lora``: earlier nights for the later ones and
back). A completed trial's final loss is exact. The probability that the judged trial ends below every other
trial that will finish (completed or running; pruned trials never finish) is, with the trials' errors
independent,

    P(best) = ∫ φ_i(x) · Π_j P(X_j > x) dx,

and the trial is pruned when P(best) < α. One number with one meaning, if the independence and the normal
errors hold: this script checks whether they do.

1. Synchronous (every trial at fraction f): the true best's P(best) and its rank by the loss at f, and how
   many trials are below α = 0.05 / 0.01 / 0.001.
2. An asynchronous replay (4 workers, 10 random trial orders, a trial judged at every report from
   ``min_fraction`` on; the replays' own setting, written out here in a few lines because the rule needs every
   competitor's fraction): compute (share of the reports trained), mean regret (kept best over the true best,
   %), orders in which the best was cut; then the same judged only at a few fractions (rungs), the usual cure
   for a test repeated at every report.

About 3 minutes on the 2-core machine.

    nice -n 5 .venv/bin/python studies/bench/p_best.py [--orders 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from scipy.stats import norm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from surestop_lora import read_surestop_lora, split_nights

_Z = np.linspace(-6.0, 6.0, 481)  # integration grid of the judged trial's error, in standard deviations
_W = norm.pdf(_Z) / norm.pdf(_Z).sum()


def log_losses(curves: list) -> tuple[np.ndarray, np.ndarray]:
    """(t̂ of the shared report grid, log losses: one row per run, the last column the final loss)."""
    return np.asarray(curves[0].t_hat, dtype=float), np.log(np.array([np.asarray(c.loss) for c in curves]))


def drop_model(reference: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per report: the median drop of log loss from there to the end, and the standard deviation around it."""
    drop = reference - reference[:, -1:]
    median = np.median(drop, axis=0)
    return median, np.std(drop - median, axis=0)


def p_best(mu: float, sd: float, others: list[tuple[float, float]]) -> float:
    """P(the trial ~ N(mu, sd²) ends below every other), each other (mean, sd) independent; sd 0 = exact."""
    xs = mu + sd * _Z
    log_survive = np.zeros_like(xs)
    for m, s in others:
        log_survive += np.where(xs < m, 0.0, -np.inf) if s <= 0 else norm.logsf((xs - m) / s)
    return float((_W * np.exp(log_survive)).sum())


def synchronous(test: np.ndarray, t: np.ndarray, median: np.ndarray, sd: np.ndarray) -> list[str]:
    """Markdown rows: per fraction, the true best's rank and P(best), and the trials below each α."""
    best = int(np.argmin(test[:, -1]))
    rows = []
    for f in (0.06, 0.1, 0.14, 0.2, 0.3, 0.5, 0.7, 0.9):
        k = int(np.argmin(np.abs(t - f)))
        mu = test[:, k] - median[k]
        p = [p_best(mu[i], sd[k], [(mu[j], sd[k]) for j in range(len(mu)) if j != i]) for i in range(len(mu))]
        below = " / ".join(str(sum(x < a for x in p)) for a in (0.05, 0.01, 0.001))
        rank = int((mu < mu[best]).sum()) + 1
        rows.append(f"| {t[k]:.2f} | {100 * sd[k]:.2f}% | {rank} | {p[best]:.3f} | {below} |")
    return rows


def replay(test: np.ndarray, t: np.ndarray, median: np.ndarray, sd: np.ndarray, alpha: float,
           min_fraction: float, order: list[int], workers: int = 4,
           rungs: tuple[float, ...] | None = None) -> tuple[float, float, bool]:
    """One order: (compute, regret of the kept best in %, whether the true best was cut). A trial is judged at
    every report from ``min_fraction`` on, or with ``rungs`` only at the reports nearest those fractions."""
    judged = set(range(len(t))) if rungs is None else {int(np.argmin(np.abs(t - r))) for r in rungs}
    n, m = test.shape
    reached = np.full(n, -1)
    state = ["waiting"] * n
    queue, running, trained = list(order), [], 0
    while queue or running:
        while len(running) < workers and queue:
            i = queue.pop(0)
            running.append(i)
            state[i] = "running"
        for i in list(running):
            reached[i] += 1
            trained += 1
            k = reached[i]
            if k == m - 1:
                state[i] = "done"
                running.remove(i)
                continue
            if t[k] < min_fraction or k not in judged:
                continue
            others = [(test[j, -1], 0.0) if state[j] == "done" else (test[j, reached[j]] - median[reached[j]],
                                                                     sd[reached[j]])
                      for j in range(n) if j != i and (state[j] == "done" or
                                                       (state[j] == "running" and reached[j] >= 0))]
            if others and p_best(test[i, k] - median[k], sd[k], others) < alpha:
                state[i] = "pruned"
                running.remove(i)
    kept = min((i for i in range(n) if state[i] == "done"), key=lambda i: test[i, -1])
    best = int(np.argmin(test[:, -1]))
    return trained / (n * m), 100.0 * (np.exp(test[kept, -1] - test[best, -1]) - 1.0), kept != best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--orders", type=int, default=10, help="random trial orders per setting")
    args = parser.parse_args(argv)
    earlier, later = split_nights(read_surestop_lora())
    t, early = log_losses(earlier)
    _, late = log_losses(later)
    for name, reference, test in (("later nights (model from the earlier)", early, late),
                                  ("earlier nights (model from the later)", late, early)):
        median, sd = drop_model(reference)
        print(f"\n### surestop_lora, {name}: {len(test)} runs\n")
        print("| t̂ | sd of the drop | true best's rank | its P(best) | trials below α 0.05 / 0.01 / 0.001 |")
        print("|---:|---:|---:|---:|---|")
        print("\n".join(synchronous(test, t, median, sd)))
        print("\n| α | min_fraction | compute | mean regret | best cut |\n|---:|---:|---:|---:|---:|")
        for alpha in (0.05, 0.01, 0.001):
            for min_fraction in (0.06, 0.1, 0.2, 0.3):
                orders = [list(np.random.default_rng(o).permutation(len(test))) for o in range(args.orders)]
                runs = [replay(test, t, median, sd, alpha, min_fraction, order) for order in orders]
                compute, regret = np.mean([r[0] for r in runs]), np.mean([r[1] for r in runs])
                print(f"| {alpha} | {min_fraction} | {compute:.3f} | {regret:.3f}% | "
                      f"{sum(r[2] for r in runs)} of {args.orders} |", flush=True)
        print("\n| α | judged only at t̂ | compute | mean regret | best cut |\n|---:|---|---:|---:|---:|")
        for alpha in (0.05, 0.01):
            for rungs in ((0.1, 0.2, 0.4), (0.1, 0.2, 0.4, 0.8), (0.06, 0.2, 0.6)):
                orders = [list(np.random.default_rng(o).permutation(len(test))) for o in range(args.orders)]
                runs = [replay(test, t, median, sd, alpha, 0.0, order, rungs=rungs) for order in orders]
                compute, regret = np.mean([r[0] for r in runs]), np.mean([r[1] for r in runs])
                print(f"| {alpha} | {', '.join(map(str, rungs))} | {compute:.3f} | {regret:.3f}% | "
                      f"{sum(r[2] for r in runs)} of {args.orders} |", flush=True)


if __name__ == "__main__":
    main()
