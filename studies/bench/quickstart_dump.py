"""The quickstart's decisions with one worker and inline refits, as sorted JSON lines, and their sha256.

The second proof that a refactoring changed no decision (issue 22; ``decision_dump.py`` is the first): with
one worker and ``refit: inline`` the quickstart is deterministic, so the same code gives the same lines. Run
it before and after a change; the hashes must match. It trains the 12 quickstart trials (1–3 min, 2 cores).

    .venv/bin/python studies/bench/quickstart_dump.py                      # prints the sha256
    .venv/bin/python studies/bench/quickstart_dump.py --out /tmp/q.jsonl   # also writes the lines

What is dumped, per trial (by number): its state, value, params, the count of intermediate values, and every
entry of its decision log (``trial_decisions``). The sweep is ``studies/quickstart.yaml`` with
``executor.num_cpus: 1`` (one trial at a time) and ``pruner.reference.refit: inline``, written to a temporary
folder; nothing under the repository is written. Nothing here is timed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import optuna
import yaml

from collapse_hpo.hpo.cli import main as cli_main
from collapse_hpo.hpo.optuna_side.pruner import trial_decisions

QUICKSTART = Path(__file__).resolve().parents[2] / "studies" / "quickstart.yaml"


def dump(folder: Path) -> list[str]:
    """Run the one-worker, inline-refit quickstart in ``folder`` and return its sorted JSON lines."""
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["name"] = "quickstart_dump"
    doc["executor"] = {**doc.get("executor", {}), "num_cpus": 1}
    doc["pruner"]["reference"] = {**doc["pruner"]["reference"], "refit": "inline"}
    sweep = folder / "quickstart_dump.yaml"
    sweep.write_text(yaml.safe_dump(doc, sort_keys=False))
    results = folder / "results"
    code = cli_main(["run", str(sweep), "--results", str(results)])
    if code != 0:
        raise SystemExit(f"quickstart_dump: the sweep exited {code}")
    study = optuna.load_study(study_name="quickstart_dump", storage=f"sqlite:///{results / 'study.db'}")
    lines = []
    for t in study.get_trials(deepcopy=False):
        head = {"trial": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                "reports": len(t.intermediate_values)}
        lines.append(json.dumps(head, sort_keys=True))
        for entry in trial_decisions(t):
            lines.append(json.dumps({"trial": t.number, **entry}, sort_keys=True, default=str))
    return sorted(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON lines here")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory(prefix="quickstart_dump_", dir=os.environ.get("TMPDIR")) as tmp:
        lines = dump(Path(tmp))
    text = "\n".join(lines) + "\n"
    if args.out is not None:
        args.out.write_text(text)
    print(f"{len(lines)} lines; sha256 {hashlib.sha256(text.encode()).hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
