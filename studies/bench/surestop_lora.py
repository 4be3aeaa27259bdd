"""Read ../shared/extdata/surestop_lora (197 real LoRA fine-tuning runs) as ``Curve`` objects, in memory.

The file (``lora_pool_dev.json``, see its PROVENANCE.txt): Qwen2.5-0.5B LoRA SFT runs of a random search over
lr, rank, batch, warm-up, weight decay and dropout; 750 optimizer steps each; validation cross-entropy every
15 steps (50 evaluations); linear warm-up over ``warmup_frac`` of the steps, then cosine decay to zero. Runs
are in (night_seed, draw) order.

As curves: t̂ = step / 750 (every run has the same number of steps, so t̂ is also the fraction of its
tokens up to batch size, which differs per run and is not recorded per evaluation); the schedule is
``cosine`` with the run's warm-up and final 0; τ = 1/(η λ S) with S = 750 steps (the AdamW timescale in units
of the run); TPP is not defined for fine-tuning (None). ``meta`` holds the config and the night.

``split_nights`` cuts the runs by night into an earlier part (for choices and calibration) and a later part
(to report on), so that nothing reported on was used to choose.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from collapse_hpo.predictors.curves import Curve
from collapse_hpo.predictors.schedules import Schedule

REPO = Path(__file__).resolve().parents[2]
#: ../shared/extdata next to the repository (or next to the folder of worktrees holding it).
DEFAULT_PATH = next(
    (p for p in (r / "shared" / "extdata" / "surestop_lora" / "lora_pool_dev.json" for r in REPO.parents[:2])
     if p.exists()),
    REPO.parent / "shared" / "extdata" / "surestop_lora" / "lora_pool_dev.json",
)
STEPS = 750  # optimizer steps of every run (the source's documentation)


def read_surestop_lora(path: str | Path = DEFAULT_PATH) -> list[Curve]:
    """Every run of ``lora_pool_dev.json`` as a Curve (named ``n<night>-d<draw>``), in the file's order."""
    data = json.loads(Path(path).read_text())
    steps = np.asarray(data["eval_steps"], dtype=float)
    curves = []
    for r in data["runs"]:
        cfg = r["config"]
        lr, wd = float(cfg["lr"]), float(cfg["weight_decay"])
        tau = 1.0 / (lr * wd * STEPS) if lr > 0 and wd > 0 else None
        curves.append(Curve(
            run=f"n{r['night_seed']}-d{r['draw']}",
            t_hat=steps / STEPS,
            loss=np.asarray(r["val_ce"], dtype=float),
            schedule=Schedule(kind="cosine", warmup=float(cfg["warmup_frac"]), final=0.0),
            tau=tau if tau is not None and math.isfinite(tau) else None,
            tpp=None,
            meta={**cfg, "night_seed": r["night_seed"]},
        ))
    return curves


def split_nights(curves: list[Curve], fraction: float = 0.45) -> tuple[list[Curve], list[Curve]]:
    """(earlier, later): the runs of the earliest nights holding about ``fraction`` of the runs, and the rest.

    Whole nights stay on one side (a night's runs share its machine and its software state).
    """
    nights = sorted({c.meta["night_seed"] for c in curves})
    earlier: set[int] = set()
    for night in nights:
        if sum(1 for c in curves if c.meta["night_seed"] in earlier) >= fraction * len(curves):
            break
        earlier.add(night)
    return ([c for c in curves if c.meta["night_seed"] in earlier],
            [c for c in curves if c.meta["night_seed"] not in earlier])
