"""The collapse rule with the early loss ratio (issue 20, item 2) against every peer, on every sweep family.

``decision.EARLY_JUDGEMENT``: during a trial's first judgements (t̂ ≤ 1.5 × min_fraction) every competitor is
compared by the loss ratio at a common fraction, whatever its controls, with ``margin`` as the whole margin.
This script replays our pruner (defaults; ``per_trial_controls.DirectCollapse``, the same judge as the Optuna
pruner) and the peers of ``peers.PEERS`` on:

- random configurations: random_s0 (development: EARLY_JUDGEMENT was chosen there) and random_s1 (out of
  sample), reference = the other random sweep;
- λ fixed (τ differs per trial): lr_lambda_s{0,1}, bs_lambda_s{0,1}, reference = the 99K collapse family;
- τ held: lr_tau_s{0,1}, bs_tau_s{0,1} (equal controls: unchanged by the early comparison), same reference;
- surestop_lora (197 real LoRA fine-tuning runs, ../shared/extdata): the earlier nights (development, not
  used for any choice here) and the later nights (out of sample), each with a reference calibrated on the
  other part.

Prints one markdown table (compute, best cut, mean regret of ours; the cheapest peer whose best-cut rate is
≤ 1/20 and mean regret ≤ 0.1%; the absolute targets) and writes it to ``--out``/early_judgement.md.

    nice -n 10 .venv/bin/python studies/bench/early_judgement.py --orders 20
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import per_trial_controls as ptc  # noqa: E402
import pruning_rule  # noqa: E402
import surestop_lora  # noqa: E402

from collapse_hpo.hpo.replays import peers  # noqa: E402
from collapse_hpo.hpo.replays.replay import Summary, make_sweep, replay  # noqa: E402

FAMILIES = {
    "random": ("random_s0", "random_s1"),
    "lambda": ("lr_lambda_s0", "lr_lambda_s1", "bs_lambda_s0", "bs_lambda_s1"),
    "tau": ("lr_tau_s0", "lr_tau_s1", "bs_tau_s0", "bs_tau_s1"),
    "surestop": ("surestop_earlier", "surestop_later"),
}
#: The issue's absolute compute targets (defaults).
TARGETS = {"random": 0.25, "tau": 0.30, "surestop": 0.15}
#: "As well as": the best cut in at most 1 of 20 orders and mean regret ≤ 0.1%.
MAX_CUT, MAX_REGRET = 1 / 20 + 1e-9, 0.001


def load(name: str, cache: dict[str, Any]) -> tuple[Any, Any, str]:
    """(sweep, reference surrogate, what the reference was calibrated on) for a sweep name."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if name.startswith("surestop"):
            earlier, later = surestop_lora.split_nights(surestop_lora.read_surestop_lora())
            mine, other = (earlier, later) if name == "surestop_earlier" else (later, earlier)
            key = "surestop_" + ("later" if name == "surestop_earlier" else "earlier")
            if key not in cache:
                cache[key] = ptc.fit(other)
            return make_sweep(mine, name=name, source=name), cache[key], f"{key} ({len(other)} runs)"
        if name.split("_")[1] == "tau":
            family = name.rsplit("_", 1)[0]
            sw = next(s for s in pruning_rule.sweeps(pruning_rule.EVAL, family) if s.name == name)
            return sw, ptc.reference_for("lr_lambda_s0", cache)[0], "the 99K collapse family"
        surrogate, what = ptc.reference_for(name, cache)
        return ptc.load_sweep(name), surrogate, what


def late_compute(sw: Any, results: list[Any]) -> float:
    """Mean share of the unpruned sweep's tokens spent on trials pruned after t̂ 0.3 (issue 20, item 4)."""
    shares = []
    for r in results:
        reached = sw.grid[r.stopped_at] / sw.grid[-1]
        late = r.pruned & (reached > 0.3)
        shares.append(float((reached * sw.weights)[late].sum() / sw.weights.sum()))
    return sum(shares) / len(shares)


def cheapest(peer_sums: list[Summary]) -> str:
    """The cheapest peer that does as well (best cut ≤ 1/20, mean regret ≤ 0.1%), as 'name compute'."""
    ok = [s for s in peer_sums if s.best_pruned_rate <= MAX_CUT and s.relative_regret <= MAX_REGRET
          and s.pruner != "none"]
    if not ok:
        return "none does"
    best = min(ok, key=lambda s: s.compute)
    return f"{best.pruner} {best.compute:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    ap.add_argument("--no-peers", action="store_true", help="ours only")
    ap.add_argument("--margin", type=float, default=None, help="ours at this margin (default: the default)")
    ap.add_argument("--out", default=str(HERE / "artifacts"))
    args = ap.parse_args(argv)
    cache: dict[str, Any] = {}
    names = [n for n in peers.PEERS if n != "none" and not peers.unavailable([n])]
    lines = [
        "| sweep | trials | ours: compute / best cut / mean regret | ours: compute on trials pruned after "
        "t̂ 0.3 | cheapest peer as good "
        "(cut ≤ 1/20, regret ≤ 0.1%) | top-k-10 | compute target |",
        "|---|---:|---|---:|---|---|---|",
    ]
    for family in args.families:
        for name in FAMILIES[family]:
            t0 = time.time()
            sw, surrogate, _what = load(name, cache)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                mine = {} if args.margin is None else {"margin": args.margin}
                (ours,), details = replay(sw, [ptc.direct_factory("collapse", surrogate, **mine)],
                                          orders=args.orders, workers=args.workers, seed=0)
                peer_sums: list[Summary] = []
                if not args.no_peers:
                    peer_sums, _ = replay(sw, [peers.factory(n) for n in names], orders=args.orders,
                                          workers=args.workers, seed=0)
            topk = next((s for s in peer_sums if s.pruner == "top-k-10"), None)
            good = ours.best_pruned_rate <= MAX_CUT and ours.relative_regret <= MAX_REGRET
            target = TARGETS.get(family)
            tgt = "-" if target is None else (
                f"≤ {target}: {'met' if good and ours.compute <= target else 'missed'}")
            late = late_compute(sw, details["collapse"])
            tk = "-" if topk is None else (
                f"{topk.compute:.3f} / {topk.best_pruned_rate:.2f} / {topk.relative_regret:.3%}")
            lines.append(
                f"| {name} | {sw.n_trials} | {ours.compute:.3f} / {ours.best_pruned_rate:.2f} / "
                f"{ours.relative_regret:.3%} | {late:.3f} | {cheapest(peer_sums) if peer_sums else '-'} "
                f"| {tk} | {tgt} |"
            )
            print(lines[-1], flush=True)
            print(f"  ({name}: {time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    title = "# Early loss ratio: ours against the peers (studies/bench/early_judgement.py)"
    setup = f"{args.orders} orders, {args.workers} workers, margin {args.margin or 'default'}."
    text = "\n".join([title, "", setup, "", *lines, ""])
    (out / "early_judgement.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
