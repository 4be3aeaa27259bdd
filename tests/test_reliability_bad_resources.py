"""Issue 6.6, "writes nothing", for a sweep whose trials need more than the Ray cluster has.

`collapse-hpo run` with ``resources.cpu`` above the cluster's CPUs must exit 2 with one line naming the file
and ``field 'resources'``, and create nothing. RELIABILITY.md row 6: this was a bug (the check ran after the
results folder and the study were created, so a corrected file was then refused by `run`); it is fixed: for
a local Ray the check runs before anything is created, and these tests keep it so.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from collapse_hpo.hpo import cli


def _sweep(tmp_path: Path) -> Path:
    """A valid tiny sweep whose trials need 4 CPUs on a local Ray cluster of 2."""
    doc = {
        "name": "cap",
        "model": {"width": 16, "depth": 1, "heads": 2, "context": 64},
        "tpp": 10,
        "fixed": {"batch_tokens": 512},
        "space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
        "trials": 2,
        "resources": {"cpu": 4},
        "executor": {"num_cpus": 2},
        "results": str(tmp_path / "results"),
    }
    path = tmp_path / "cap.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_resources_above_the_cluster_exit_2_naming_the_field(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = _sweep(tmp_path)
    code = cli.main(["run", str(path)])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1, err
    assert str(path) in err[0] and "field 'resources'" in err[0] and "2.0 CPU" in err[0], err[0]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_resources_above_the_cluster_write_nothing(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path = _sweep(tmp_path)
    assert cli.main(["run", str(path)]) == 2
    capsys.readouterr()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap.yaml"]
