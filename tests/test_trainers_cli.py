"""`collapse-hpo train` and TrainConfig input checks."""

from __future__ import annotations

import json

import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.predictors.curves import read_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.trainers.config import TrainConfig


@pytest.fixture()
def text_corpus(tmp_path) -> str:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(f"def f{i}(x):\n    return x * {i} + {i % 7}\n\n" for i in range(3000)))
    return str(path)


TINY = [
    "--width",
    "16",
    "--depth",
    "1",
    "--heads",
    "2",
    "--base-width",
    "16",
    "--base-depth",
    "1",
    "--context",
    "16",
    "--batch-tokens",
    "256",
    "--total-tokens",
    "4096",
    "--threads",
    "1",
    "--quiet",
]


@pytest.mark.slow
def test_train_command_writes_a_curve_csv_the_predictor_reads(tmp_path, text_corpus, capsys):
    out = tmp_path / "curves.csv"
    meta = tmp_path / "meta.json"
    rc = main(
        [
            "train",
            *TINY,
            "--corpus",
            text_corpus,
            "--tau",
            "0.2",
            "--lr",
            "0.01",
            "--run",
            "a",
            "-o",
            str(out),
            "--metadata",
            str(meta),
        ]
    )
    assert rc == 0
    rc = main(
        [
            "train",
            *TINY,
            "--corpus",
            text_corpus,
            "--weight-decay",
            "0.5",
            "--seed",
            "1",
            "--run",
            "b",
            "--schedule",
            "cosine",
            "-o",
            str(out),
            "--append",
        ]
    )
    assert rc == 0
    curves = {c.run: c for c in read_curves_csv(out)}
    assert set(curves) == {"a", "b"}
    a, b = curves["a"], curves["b"]
    assert a.tau == pytest.approx(0.2) and a.t_hat[-1] == 1.0 and len(a.t_hat) == 16
    assert b.tau == pytest.approx(256 / (0.003 * 0.5 * 4096))  # τ reported from λ
    md = json.loads(meta.read_text())
    assert a.tpp == pytest.approx(md["tpp"]) and md["params_non_embedding"] == 16 * 16 * 12 + 6 * 16
    assert md["corpus_sha256"] and md["fault"] is None
    assert a.final_loss == pytest.approx(md["config"] and a.loss[-1])
    assert "final_loss" in capsys.readouterr().out


def test_train_command_refuses_tau_with_weight_decay_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "x.csv"
    rc = main(["train", *TINY, "--tau", "0.2", "--weight-decay", "0.1", "-o", str(out)])
    assert rc == 2 and not out.exists()
    assert "--tau" in capsys.readouterr().err
    rc = main(["train", *TINY, "--fault-at", "0.4", "-o", str(out)])
    assert rc == 2 and not out.exists()
    rc = main(["train", *TINY, "--heads", "3", "-o", str(out)])
    assert rc == 2 and not out.exists()


def test_train_config_rejects_bad_values_naming_the_field():
    with pytest.raises(InputError, match=r"TrainConfig\.batch_tokens"):
        TrainConfig(batch_tokens=1000)
    with pytest.raises(InputError, match=r"TrainConfig\.micro_batch_tokens"):
        TrainConfig(batch_tokens=4096, micro_batch_tokens=384)
    with pytest.raises(InputError, match=r"TrainConfig\.tpp"):
        TrainConfig(tpp=20, total_tokens=10_000)
    with pytest.raises(InputError, match=r"TrainConfig\.dtype"):
        TrainConfig(dtype="bfloat16")
    with pytest.raises(InputError, match="unknown field"):
        TrainConfig.from_dict({"width": 32, "widht": 3})
    c = TrainConfig(width=32, heads=2, tau=float("inf"), schedule="cosine")  # legacy "no decay"
    assert c.tau is None and c.to_dict()["tau"] is None  # one encoding of "no weight decay": None
    assert TrainConfig.from_dict(c.to_dict()) == c == TrainConfig.from_dict({**c.to_dict(), "tau": "inf"})
    assert json.loads(json.dumps(c.to_dict()))["schedule"]["kind"] == "cosine"
