"""Compare pruners by frontiers: each family's own knobs swept; compute against mean regret and best-cut rate.

A pruner's default is one point; a user picks the setting that saves the most at the regret they accept.
``frontier`` replays a sweep (hpo/replays/replay.py, the same random trial orders for every setting) through
every setting of each family's grid (``peers.FRONTIER_KNOBS``) and returns one ``FrontierPoint`` per setting:

- compute: mean share of the unpruned sweep's tokens (equal token budgets: of its report steps);
- regret: mean relative regret over the orders (best kept final loss minus the best final loss, over the
  best final loss);
- best_cut: the share of orders in which the trial with the best final loss was pruned;
- late: mean share of the unpruned sweep's tokens spent on trials pruned after t̂ 0.3
  (``replay.LATE_FRACTION``).

A setting is on its family's frontier (``on_regret_frontier``, ``on_best_cut_frontier``) when no other
setting of the family is at no more compute and no more regret (best-cut rate) and better in one of them.
``coverage`` checks the issue-20 target: for every point of a peer family's compute-regret frontier, is there
a setting of ours at no more compute and no more mean regret?

Needs numpy (matplotlib for ``plot_frontier``).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from collapse_hpo.hpo.figures import pyplot, save_png
from collapse_hpo.hpo.replays.peers import FRONTIER_KNOBS, frontier_factory
from collapse_hpo.hpo.replays.replay import Sweep, replay
from collapse_hpo.predictors import spreadsheet

#: Compute and regret closer than this count as equal (float noise of means over orders).
TIE = 1e-9


@dataclass(frozen=True)
class Setting:
    """One combination of a family's knobs."""

    family: str
    knobs: tuple[tuple[str, Any], ...]

    @property
    def label(self) -> str:
        """``family[knob=value,...]``, the name in tables, CSV and plots."""
        cells = (f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.knobs)
        return f"{self.family}[{','.join(cells)}]"


def settings(family: str, knobs: dict[str, dict[str, Sequence[Any]]] | None = None) -> list[Setting]:
    """Every combination of ``family``'s knob values (``peers.FRONTIER_KNOBS`` unless ``knobs`` is given)."""
    grid = (knobs or FRONTIER_KNOBS)[family]
    names = list(grid)
    combos = itertools.product(*(grid[n] for n in names))
    return [Setting(family, tuple(zip(names, values))) for values in combos]


@dataclass
class FrontierPoint:
    """One setting's replays of a sweep, averaged over the trial orders."""

    sweep: str
    family: str
    setting: str
    compute: float  # mean share of the unpruned sweep's tokens
    regret: float  # mean relative regret (share of the best final loss)
    best_cut: float  # share of orders in which the best trial was pruned
    orders: int
    on_regret_frontier: bool = False
    on_best_cut_frontier: bool = False
    late: float = float("nan")  # mean share of the unpruned tokens spent on trials pruned after t̂ 0.3

    def row(self) -> dict[str, object]:
        """The point as a flat dict for CSV."""
        return dict(self.__dict__)


def pareto(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each (cost, loss) pair, whether no other pair is at most as large in both and smaller in one."""
    out = []
    for i, (c, r) in enumerate(points):
        dominated = any(
            c2 <= c + TIE and r2 <= r + TIE and (c2 < c - TIE or r2 < r - TIE)
            for j, (c2, r2) in enumerate(points) if j != i
        )
        out.append(not dominated)
    return out


def mark_frontiers(points: Sequence[FrontierPoint]) -> None:
    """Set each point's frontier flags within its family (and sweep)."""
    groups: dict[tuple[str, str], list[FrontierPoint]] = {}
    for p in points:
        groups.setdefault((p.sweep, p.family), []).append(p)
    for group in groups.values():
        for p, on in zip(group, pareto([(p.compute, p.regret) for p in group])):
            p.on_regret_frontier = on
        for p, on in zip(group, pareto([(p.compute, p.best_cut) for p in group])):
            p.on_best_cut_frontier = on


def frontier(
    sweep: Sweep,
    families: Sequence[str],
    *,
    surrogate: Any = None,
    orders: int = 20,
    workers: int = 4,
    seed: int = 0,
    jobs: int = 1,
    progress: Callable[[str], None] | None = None,
    knobs: dict[str, dict[str, Sequence[Any]]] | None = None,
) -> list[FrontierPoint]:
    """Replay ``sweep`` through every setting of each family (same orders for all) and mark the frontiers.

    ``progress`` gets one line per finished setting, numbered ``[i/N]``, and replay's lines on long ones.
    """
    chosen = [s for family in families for s in settings(family, knobs)]
    factories = [frontier_factory(s.family, s.label, dict(s.knobs), surrogate=surrogate) for s in chosen]
    count = [0]

    def said(line: str) -> None:
        if progress is None:
            return
        if line.startswith(" "):
            progress(line)
        else:
            count[0] += 1
            progress(f"[{count[0]}/{len(chosen)}] {line}")

    summaries, _ = replay(sweep, factories, orders=orders, workers=workers, seed=seed, jobs=jobs,
                          progress=said if progress is not None else None)
    points = [
        FrontierPoint(sweep=sweep.name, family=s.family, setting=s.label, compute=m.compute,
                      regret=m.relative_regret, best_cut=m.best_pruned_rate, orders=m.orders,
                      late=m.late_compute)
        for s, m in zip(chosen, summaries)
    ]
    mark_frontiers(points)
    return points


@dataclass
class Coverage:
    """How much of a peer family's compute-regret frontier a family of ours matches or beats."""

    sweep: str
    ours: str
    peer: str
    covered: int  # frontier points of the peer with a setting of ours at no more compute and regret
    total: int  # frontier points of the peer
    missed: list[str]  # labels of the peer's frontier points not covered

    @property
    def hit(self) -> bool:
        """Every frontier point of the peer is covered."""
        return self.covered == self.total


def coverage(points: Sequence[FrontierPoint], ours: str, peer: str) -> Coverage:
    """Whether every point of ``peer``'s compute-regret frontier has a setting of ``ours`` at no more compute
    and no more mean regret (the issue-20 "Frontier" target), on one sweep."""
    mine = [p for p in points if p.family == ours]
    theirs = [p for p in points if p.family == peer and p.on_regret_frontier]
    if not mine or not theirs:
        raise ValueError(f"coverage: no points of {ours if not mine else peer!r}")
    missed = [
        q.setting for q in theirs
        if not any(p.compute <= q.compute + TIE and p.regret <= q.regret + TIE for p in mine)
    ]
    return Coverage(sweep=theirs[0].sweep, ours=ours, peer=peer, covered=len(theirs) - len(missed),
                    total=len(theirs), missed=missed)


HEADER = f"{'setting':<46} {'compute':>8} {'regret':>9} {'best cut':>8} {'late':>6}  frontier"


def format_point(p: FrontierPoint) -> str:
    """One aligned row: setting, compute, mean regret (%), best-cut rate, late compute (spent on trials pruned
    after t̂ 0.3), frontier marks.

    The marks: ``R`` on the family's compute-regret frontier, ``B`` on its compute-best-cut frontier.
    """
    marks = ("R" if p.on_regret_frontier else "-") + ("B" if p.on_best_cut_frontier else "-")
    late = "-" if p.late != p.late else f"{p.late:.3f}"  # NaN: an old CSV without it
    return f"{p.setting:<46} {p.compute:>8.3f} {p.regret:>9.4%} {p.best_cut:>8.2f} {late:>6}  {marks}"


def format_frontier(points: Sequence[FrontierPoint]) -> str:
    """The table of every setting, family by family, each sorted by compute."""
    lines = [HEADER]
    families = list(dict.fromkeys(p.family for p in points))
    for family in families:
        lines.extend(format_point(p) for p in sorted((p for p in points if p.family == family),
                                                      key=lambda p: (p.compute, p.regret)))
    lines.append("late: share of the unpruned sweep's tokens spent on trials pruned after t_hat 0.3")
    lines.append("frontier: R = no setting of the family at no more compute and no more mean regret (better "
                 "in one); B = the same with the best-cut rate")
    return "\n".join(lines)


def write_frontier_csv(path: str | os.PathLike[str], points: Sequence[FrontierPoint]) -> None:
    """Write every point as CSV, atomically."""

    spreadsheet.write_csv(path, list(FrontierPoint.__dataclass_fields__), (p.row() for p in points))


def plot_frontier(path: str | os.PathLike[str], points: Sequence[FrontierPoint], title: str = "") -> None:
    """Two panels: compute against mean regret, and compute against best-cut rate; one marker set per family,
    its frontier drawn as a line through its frontier points. Regret on a symlog axis (zero stays visible).
    Written atomically as PNG."""
    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(12.0, 5.0))
    markers = "osD^v<>ph*X"
    families = list(dict.fromkeys(p.family for p in points))
    for j, family in enumerate(families):
        mine = [p for p in points if p.family == family]
        ours = family.startswith("collapse")
        style = {"marker": markers[j % len(markers)], "color": f"C{j % 10}"}
        for ax, value, flag in ((axes[0], lambda p: 100 * p.regret, "on_regret_frontier"),
                                (axes[1], lambda p: p.best_cut, "on_best_cut_frontier")):
            ax.scatter([p.compute for p in mine], [value(p) for p in mine], s=14, alpha=0.35, **style)
            front = sorted((p for p in mine if getattr(p, flag)), key=lambda p: p.compute)
            ax.plot([p.compute for p in front], [value(p) for p in front], lw=2.2 if ours else 1.2,
                    ls="-" if ours else "--", label=family, **style)
    axes[0].set_yscale("symlog", linthresh=0.05)
    axes[0].set_ylabel("mean regret (% of best final loss)")
    axes[1].set_ylabel("best-cut rate (share of orders)")
    for ax in axes:
        ax.set_xlabel("compute (share of the unpruned sweep's tokens)")
        ax.set_xlim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title or (points[0].sweep if points else ""))
    fig.tight_layout()
    save_png(fig, path, dpi=110)

