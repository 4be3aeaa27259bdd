"""Hostile or huge sweep YAML (issue 23, item 5): an alias bomb, a file over the size limit, and huge values
are refused in one short line, in bounded memory and time, with every echoed value cut to an excerpt."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import MAX_SWEEP_BYTES, MAX_YAML_NODES, load_sweep
from collapse_hpo.predictors.errors import MESSAGE_CHARS

HEAD = ("name: t\nmodel: {width: 16, depth: 1, heads: 2, context: 64}\ntpp: 20\nfixed: {batch_tokens: 512}\n"
        "space:\n  lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}\ntrials: 4\n")


def _bomb(depth: int) -> str:
    """Anchors nested ``depth`` deep, each a list of 9 aliases of the one before: 9**(depth+1) leaves."""
    parts = ["&a0 [x, x, x, x, x, x, x, x, x]"]
    parts += [f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, depth + 1)]
    return HEAD + "schedule:\n  kind: linear\n  warmup: [" + ", ".join(parts) + "]\n"


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "" and len(lines) == 1, (code, out[:300], err[:300])
    return lines[0]


def _limit_memory() -> None:  # runs in the child: a bomb expanded on the heap ends in MemoryError
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def test_an_alias_bomb_is_refused_in_one_line_within_bounded_memory(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(7))
    assert path.stat().st_size < 1024  # 9**8 = 43 million list items once expanded
    proc = subprocess.run([sys.executable, "-m", "collapse_hpo.hpo.cli", "run", str(path)],
                          capture_output=True, text=True, timeout=120, preexec_fn=_limit_memory, cwd=tmp_path)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr[-2000:])
    assert f"expands to more than {MAX_YAML_NODES} YAML nodes" in lines[0] and str(path) in lines[0]
    assert len(lines[0]) < 400
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.yaml"]


def test_a_small_bomb_and_a_recursive_alias_are_refused(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "small.yaml"
    path.write_text(_bomb(5))  # 531 441 items: passed validation and echoed 3 MB
    assert "expands to more than" in _one_line(capsys, ["run", str(path)])
    path.write_text(HEAD + "schedule: &s {kind: linear, warmup: *s}\n")
    assert "refers to the anchor that contains it" in _one_line(capsys, ["run", str(path)])


def test_aliases_within_the_bound_still_load(tmp_path: Path) -> None:
    doc = HEAD.replace("space:\n  lr: {type: float, low: 1.0e-3, high: 1.0e-1, log: true}\n",
                       "space:\n  lr: &lr {type: float, low: 1.0e-3, high: 1.0e-1, log: true}\n"
                       "  warmup: {<<: *lr, low: 0.01, high: 0.1}\n")
    path = tmp_path / "ok.yaml"
    path.write_text(doc)
    sweep = load_sweep(path)
    assert sweep.space["warmup"].low == 0.01 and sweep.space["warmup"].log is True
    assert sweep.space["lr"].high == 0.1


def test_a_file_over_the_size_limit_is_refused_naming_the_limit(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("name: " + "a" * (MAX_SWEEP_BYTES + 10) + "\n" + HEAD.split("\n", 1)[1])
    line = _one_line(capsys, ["run", str(path)])
    assert f"over {MAX_SWEEP_BYTES // 1024} KiB" in line and len(line) < 400


HUGE = "v" * 500_000
HUGE_VALUES = {
    "name": {"name": HUGE},
    "schedule kind": {"schedule": {"kind": HUGE}},
    "schedule warmup": {"schedule": {"kind": "linear", "warmup": HUGE}},
    "fixed value": {"fixed": {"batch_tokens": HUGE}},
    "unknown key": {HUGE: 1},
    "unknown hyperparameter": {"fixed": {"batch_tokens": 512, HUGE: 1}},
    "tau": {"tau": HUGE},
    "trials": {"trials": HUGE},
}


@pytest.mark.parametrize("case", sorted(HUGE_VALUES))
def test_a_huge_value_is_echoed_as_a_short_excerpt(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   case: str) -> None:
    doc = {**yaml.safe_load(HEAD), **HUGE_VALUES[case]}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, width=10**7))
    assert path.stat().st_size <= MAX_SWEEP_BYTES
    line = _one_line(capsys, ["run", str(path)])
    assert str(path) in line and len(line) < 600, line[:1000]
    assert "v" * 200 not in line
    assert len(line) <= MESSAGE_CHARS + len("collapse-hpo run: error: ")
