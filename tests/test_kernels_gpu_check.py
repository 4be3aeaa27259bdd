"""studies/bench/gpu_check.py --dry-run: the GPU check's code paths (kernel tests in a subprocess, the
loss-step comparison, a training run through the trainer's API) at tiny shapes on CPU, ending in one table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_dry_run_prints_one_table_with_every_check():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, "studies/bench/gpu_check.py", "--dry-run"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    table = [line for line in lines if line.startswith("| ")]
    assert table[0] == "| check | result | detail |"
    checks = {line.split(" | ")[0].lstrip("| "): line for line in table[1:]}
    kernel = [line for name, line in checks.items() if name.startswith("kernel tests")]
    assert len(kernel) == 1 and "| PASS |" in kernel[0] and " passed" in kernel[0]
    fused = next(line for name, line in checks.items() if name.endswith("fused_linear_cross_entropy"))
    plain = "F.cross_entropy(hidden @ weight.T)"
    reference = next(line for name, line in checks.items() if name.endswith(plain))
    for line in (fused, reference):
        assert line.count(" | ") == 2 and " ms | " in line and "Δloss" in line
    training = next(line for name, line in checks.items() if name.startswith("training"))
    tokens_per_s = float(training.split(" | ")[1].split()[0].replace(",", ""))
    assert tokens_per_s > 0
    assert not any("ERROR" in line or "FAIL" in line for line in table)
