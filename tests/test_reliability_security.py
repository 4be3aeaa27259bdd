"""Issue 12, "Security": no code from a checkpoint file, no password persisted, state files that keep their
mode and leave no temporary file behind. Real files, a real SQLite study, the real CLI."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import parse_sweep
from collapse_hpo.hpo.sweep.runner import SWEEP_ATTR, create_study, locate, masked_sweep, shippable_sweep
from collapse_hpo.hpo.sweep.urls import STORAGE_ENV, mask_text, resolve_url
from collapse_hpo.predictors.atomic import atomic_write, clean_stale_tmp
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.synthetic import synthetic_curves
from collapse_hpo.trainers.checkpoint import load_checkpoint
from collapse_hpo.trainers.config import TrainConfig

SECRET = "s3cr3t-pw"


class _Payload:
    """Unpickling this runs ``touch <marker>``: what a crafted checkpoint.pt does with weights_only=False."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_a_checkpoint_with_a_payload_is_refused_and_never_run(tmp_path: Path, capsys: Any) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    marker = tmp_path / "payload-ran"
    torch.save({"format_version": 1, "model": {}, "x": _Payload(marker)}, ckpt / "checkpoint.pt")
    config = TrainConfig(width=16, depth=1, heads=2, context=64, batch_tokens=512, tpp=5,
                         checkpoint_dir=str(ckpt))
    with pytest.raises(InputError, match=r"refused.*(os|posix)\.system") as info:
        load_checkpoint(config)
    assert "\n" not in str(info.value)
    assert not marker.exists()
    # Through the command line: one line, exit 2, the payload never ran.
    code = cli.main(["train", "--width", "16", "--depth", "1", "--heads", "2", "--context", "64",
                     "--batch-tokens", "512", "--tpp", "5", "--checkpoint-dir", str(ckpt),
                     "--quiet", "-o", str(tmp_path / "run.csv")])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert code == 2 and len(err) == 1 and "refused" in err[-1]
    assert not marker.exists()


def test_passwords_are_masked_in_every_message() -> None:
    assert mask_text("postgresql://bob:pw@host:5432/db") == "postgresql://bob:***@host:5432/db"
    assert mask_text("x postgresql+psycopg://bob:p@ss:w@h/db y") == "x postgresql+psycopg://bob:***@h/db y"
    assert mask_text("sqlite:////tmp/a@b/study.db") == "sqlite:////tmp/a@b/study.db"
    assert mask_text("postgresql://bob@h/db") == "postgresql://bob@h/db"


def test_storage_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = {"name": "env", "model": {"width": 16, "depth": 1, "heads": 2, "context": 64}, "tpp": 10,
           "fixed": {"batch_tokens": 512, "lr": 0.01}, "trials": 1}
    monkeypatch.setenv(STORAGE_ENV, f"sqlite:///{tmp_path}/env.db")
    sweep = parse_sweep(doc, "x.yaml")
    assert sweep.storage_url(tmp_path) == "${" + STORAGE_ENV + "}"
    assert resolve_url(sweep.storage_url(tmp_path), "x") == f"sqlite:///{tmp_path}/env.db"
    ref = parse_sweep({**doc, "pruner": {"reference": {"study": "fam", "storage": "${MY_REF_DB}"}}}, "x.yaml")
    monkeypatch.delenv("MY_REF_DB", raising=False)
    with pytest.raises(InputError, match="environment variable MY_REF_DB is not set"):
        ref.pruner.reference.spec(tmp_path)
    monkeypatch.setenv("MY_REF_DB", f"postgresql://u:{SECRET}@h/db")
    assert ref.pruner.reference.spec(tmp_path)["storage"].endswith("@h/db")
    assert SECRET not in yaml.safe_dump(masked_sweep(ref))


def test_the_study_sweep_config_attr_holds_no_password(tmp_path: Path) -> None:
    doc = {"name": "pw", "model": {"width": 16, "depth": 1, "heads": 2, "context": 64}, "tpp": 10,
           "fixed": {"batch_tokens": 512, "lr": 0.01}, "trials": 1, "results": str(tmp_path / "r"),
           "pruner": {"reference": {"study": "fam", "storage": f"postgresql://postgres:{SECRET}@h/test"}}}
    sweep = parse_sweep(doc, str(tmp_path / "x.yaml"))
    loc = locate(sweep)
    loc.results.mkdir(parents=True)
    study = create_study(sweep, loc)
    stored = study.user_attrs[SWEEP_ATTR]
    assert SECRET not in repr(stored) and "***" in stored["pruner"]["reference"]["storage"]
    shipped = shippable_sweep(sweep)  # what Ray is handed: ${VAR} of this process's environment
    assert SECRET not in repr(shipped.to_jsonable())
    assert shipped.pruner.reference.spec(tmp_path)["storage"] == doc["pruner"]["reference"]["storage"]


def test_state_files_keep_their_mode(tmp_path: Path) -> None:
    curves = synthetic_curves(taus=(0.2,), tpps=(20.0,), seeds=1, n_points=10, seed=0)
    p = tmp_path / "curves.csv"
    p.write_text("old")
    os.chmod(p, 0o644)
    write_curves_csv(p, curves)
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    os.chmod(p, 0o640)
    with atomic_write(p) as fh:
        fh.write("new")
    assert stat.S_IMODE(p.stat().st_mode) == 0o640 and p.read_text() == "new"
    fresh = tmp_path / "fresh.csv"
    mask = os.umask(0o022)
    try:
        with atomic_write(fresh) as fh:
            fh.write("x")
    finally:
        os.umask(mask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o644  # as open() would make it, not mkstemp's 0600
    surrogate = tmp_path / "surrogate.json"
    surrogate.write_text("{}")
    os.chmod(surrogate, 0o644)
    calibrate(curves).surrogate.save(surrogate)
    assert stat.S_IMODE(surrogate.stat().st_mode) == 0o644  # the surrogate writer keeps it too


def test_stale_temporary_files_are_removed_on_start(tmp_path: Path, capsys: Any) -> None:
    results = tmp_path / "results"
    results.mkdir()
    old = time.time() - 3 * 3600
    empty = results / ".results.csv.k3j2h1.tmp"
    empty.write_bytes(b"")
    os.utime(empty, (old, old))
    partial = results / ".curves.csv.abcd12.tmp"
    partial.write_text("run,t_hat")
    os.utime(partial, (old, old))
    live = results / ".curves.png.zz9911.tmp"  # a writer at work right now: left alone
    live.write_bytes(b"")
    keep = results / "notes.tmp"  # not ours
    keep.write_text("x")
    assert sorted(p.name for p in clean_stale_tmp(results)) == sorted([empty.name, partial.name])
    assert live.exists() and keep.exists()
    # `report` runs the cleanup at its start.
    os.utime(live, (old, old))
    doc = {"name": "st", "model": {"width": 16, "depth": 1, "heads": 2, "context": 64}, "tpp": 10,
           "fixed": {"batch_tokens": 512, "lr": 0.01}, "trials": 1, "results": str(results)}
    sweep_file = tmp_path / "st.yaml"
    sweep_file.write_text(yaml.safe_dump(doc))
    sweep = parse_sweep(doc, str(sweep_file))
    create_study(sweep, locate(sweep))
    cli.main(["report", str(sweep_file)])
    capsys.readouterr()
    assert not live.exists()
