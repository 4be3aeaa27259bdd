"""Reading a big curve file (issue 23, item 6): time and peak memory of `predict`, `monitor`, `calibrate` and
`replay` on a generated curve CSV of many rows (default 5 000 000 rows, 20 runs, about 210 MB).

The file is written by `write_big_curves` (also used by tests/test_reliability_big_curves.py): ``runs`` runs
of ``rows // runs`` rows each, t̂ evenly spaced on (0, 1], a linear-decay LR with 1% warm-up, a loss that falls
as a power law towards a per-run final loss with 0.5% noise (a fixed seed), τ and TPP constant per run. Each
command runs in its own process (`collapse-hpo` through `sys.executable -m`); the figures printed are its wall
time and its peak resident memory (``VmHWM`` of the child).

Usage::

    nice -n 10 .venv/bin/python studies/bench/big_curves.py                    # 5M rows, every command
    nice -n 10 .venv/bin/python studies/bench/big_curves.py --rows 1000000 --commands predict
    # before: an export of an older commit, reached through a folder of one link
    git archive 3a2a4f3 | tar -x -C /tmp/old && mkdir /tmp/oldpkg && ln -s /tmp/old /tmp/oldpkg/collapse_hpo
    nice -n 10 .venv/bin/python studies/bench/big_curves.py --commands predict --pythonpath /tmp/oldpkg
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HEADER = "run,t_hat,loss,lr,tau,tpp\n"
# Runs `collapse-hpo ARGV` and prints its peak resident memory (VmHWM, kB: the peak of this program since its
# exec; ru_maxrss of a child can include its parent's memory at the fork) on stderr as "PEAK_KB n".
PEAK_RSS_CHILD = (
    "import sys\nfrom collapse_hpo.hpo.cli import main\ntry:\n    rc = main(sys.argv[1:])\nfinally:\n"
    "    hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')]\n"
    "    print('PEAK_KB', hwm[0].split()[1], file=sys.stderr)\nsys.exit(rc)\n"
)


def write_big_curves(path: str | os.PathLike[str], rows: int, runs: int = 20, seed: int = 0) -> None:
    """A curve CSV of ``rows`` rows in ``runs`` runs (see the module docstring), written block by block."""
    rng = np.random.default_rng(seed)
    per_run = rows // runs
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(HEADER)
        for r in range(runs):
            final = 2.5 + 0.02 * r
            tau, tpp = (0.05, 0.1, 0.2, 0.4)[r % 4], (20.0, 80.0)[r % 2]
            for start in range(0, per_run, 100_000):
                n = min(100_000, per_run - start)
                t = (np.arange(start, start + n) + 1) / per_run
                lr = np.minimum(t / 0.01, 1.0) * 3e-3 * (1.0 - t) / (1.0 - np.minimum(t, 0.01))
                loss = final * (1.0 + 0.8 * t ** -0.3 - 0.8) * (1.0 + 0.005 * rng.standard_normal(n))
                fh.write("".join(f"run{r},{a:.9g},{b:.6g},{c:.6g},{tau},{tpp}\n"
                                 for a, b, c in zip(t, loss, lr)))


def _measure(argv: list[str], pythonpath: str | None = None) -> tuple[float, float, int, str]:
    """(wall seconds, peak RSS MiB, exit status, last stderr line) of ``collapse-hpo ARGV`` in a child
    (``pythonpath``: a folder holding another checkout as ``collapse_hpo``, searched first)."""
    code = PEAK_RSS_CHILD
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else None
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    peak = [ln for ln in proc.stderr.splitlines() if ln.startswith("PEAK_KB")]
    kb = int(peak[-1].split()[1]) if peak else 0
    others = [ln for ln in proc.stderr.splitlines() if not ln.startswith("PEAK_KB")]
    return wall, kb / 1024, proc.returncode, others[-1] if others else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=5_000_000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--commands", nargs="+", default=["predict", "monitor", "calibrate", "replay"])
    ap.add_argument("--keep", default=None, help="write the file here (kept) instead of a temporary folder")
    ap.add_argument("--pythonpath", default=None,
                    help="run the commands with another checkout: a folder holding a link collapse_hpo -> "
                    "it (e.g. main before the change, to measure 'before'); without calibrate among the "
                    "commands the surrogate is calibrated by this checkout")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.keep) if args.keep else Path(tmp) / "big.csv"
        t0 = time.perf_counter()
        if not path.exists():
            write_big_curves(path, args.rows, args.runs)
        print(f"file: {path.stat().st_size / 1e6:.0f} MB, {args.rows} rows, {args.runs} runs "
              f"(written in {time.perf_counter() - t0:.0f} s)")
        sur = Path(tmp) / "s.json"
        argvs = {
            "calibrate": ["calibrate", str(path), "-o", str(sur), "--folds", "2"],
            "predict": ["predict", str(path), "--surrogate", str(sur), "--fraction", "0.3"],
            "monitor": ["monitor", str(path), "--surrogate", str(sur)],
            "replay": ["replay", str(path), "--reports", "100", "--orders", "2", "--jobs", "1", "--pruner",
                       "collapse", "--pruner", "median", "--surrogate", str(sur)],
        }
        needs_surrogate = {"predict", "monitor"} & set(args.commands)
        order = (["calibrate"] if needs_surrogate or "calibrate" in args.commands else []) + [
            c for c in args.commands if c != "calibrate"]
        print(f"{'command':<10} {'wall s':>8} {'peak RSS MiB':>13} {'exit':>5}  last stderr line")
        for cmd in order:
            wall, mib, rc, last = _measure(argvs[cmd], None if cmd == "calibrate" and needs_surrogate
                                           and "calibrate" not in args.commands else args.pythonpath)
            print(f"{cmd:<10} {wall:>8.1f} {mib:>13.0f} {rc:>5}  {last[:100]}")


if __name__ == "__main__":
    main()
