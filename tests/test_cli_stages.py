"""Sweeps with ``stages:`` end to end through Ray Tune: the example file, and resume between stages."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.rule.record import DECISIONS_ATTR
from collapse_hpo.predictors.timescale import adamw_tau

EXAMPLE = Path(__file__).resolve().parents[1] / "studies" / "stages.yaml"


def _studies(results: Path, name: str) -> tuple[optuna.Study, optuna.Study]:
    url = f"sqlite:///{results / 'study.db'}"
    return (optuna.load_study(study_name=f"{name}-stage1", storage=url),
            optuna.load_study(study_name=f"{name}-stage2", storage=url))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_stages_example_runs_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    results = tmp_path / "res"
    assert cli.main(["run", str(EXAMPLE), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    one, two = _studies(results, "stages")
    t1 = {t.user_attrs["draw"]: t for t in one.get_trials()}
    assert len(t1) == 6 and {t.user_attrs["width"] for t in t1.values()} == {16}
    plan = two.user_attrs["stage_plan"]
    assert len(plan) == 3 and len(two.get_trials()) == 3
    for t in two.get_trials():
        a = t.user_attrs
        src = t1[plan[a["draw"]]["stage1_draw"]]
        assert a["width"] == 32
        # The transfer: hidden LR × width₁/width₂, λ re-derived at stage 2's D holding the same τ (same TPP).
        assert t.params["lr"] == pytest.approx(src.params["lr"] * 16 / 32)
        assert a["tau"] == pytest.approx(src.user_attrs["tau"])
        assert adamw_tau(a["batch_tokens"], t.params["lr"], a["weight_decay"], a["total_tokens"]) == \
            pytest.approx(a["tau"])
    # Stage 2's pruner judged with stage 1's study as its reference.
    refs = {e.get("reference") for t in two.get_trials() for e in t.user_attrs.get(DECISIONS_ATTR, [])}
    assert any(str(r).startswith("study:stages-stage1(") for r in refs), refs
    assert "stage 1 of 2: width 16" in out and "stage 2 of 2: width 32" in out
    assert "== stages" in out and "lr × 0.5" in out and "rank agreement: Spearman ρ" in out
    assert (results / "stage1" / "results.csv").is_file() and (results / "stage2" / "results.csv").is_file()
    assert (results / "transfer.csv").read_text().startswith("stage1_draw,stage2_draw,")
    # `report` reads both studies and prints both stages, the transfer and the rank agreement.
    (results / "transfer.csv").unlink()
    assert cli.main(["report", str(EXAMPLE), "--results", str(results)]) == 0
    rep = capsys.readouterr().out
    assert "== stage 1 of 2" in rep and "== stage 2 of 2" in rep and "== stages" in rep
    assert "transfer: stage 1 (width 16) → stage 2 (width 32)" in rep and "rank agreement" in rep
    assert (results / "transfer.csv").is_file()
    # `dashboard` publishes both stages, stage 2 with stage 1's study as its reference.
    assert cli.main(["dashboard", str(EXAMPLE), "--results", str(results), "--publish-only"]) == 0
    dash = capsys.readouterr().out
    assert "study 'stages-stage1'" in dash and "reference: study:stages-stage1(" in dash


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_resume_between_and_after_stages(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc.update(name="rs", trials=3, tpp=5, results=str(tmp_path / "res"))
    doc["stages"] = [{"width": 16}, {"top_k": 2}]
    path = tmp_path / "rs.yaml"
    path.write_text(yaml.safe_dump(doc))
    results = tmp_path / "res"
    from collapse_hpo.hpo.sweep import stages

    def stop(*_args: object) -> None:  # the driver is stopped between the stages
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(stages, "stage2_plan", stop)
        assert cli.main(["run", str(path)]) == 130
    url = f"sqlite:///{results / 'study.db'}"
    one = optuna.load_study(study_name="rs-stage1", storage=url)
    before = {t.number: (t.state, t.value) for t in one.get_trials()}
    assert len(before) == 3 and "rs-stage2" not in optuna.get_all_study_names(url)
    capsys.readouterr()
    # `run` again is refused (the sweep exists); `resume` keeps stage 1 and creates and runs stage 2.
    assert cli.main(["run", str(path)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert cli.main(["resume", str(path)]) == 0
    out = capsys.readouterr().out
    one, two = _studies(results, "rs")
    assert {t.number: (t.state, t.value) for t in one.get_trials()} == before
    assert "nothing left to run" in out and "stage 2 of 2" in out
    assert len(two.get_trials()) == 2 and all(t.state.is_finished() for t in two.get_trials())
    finished = {t.number: (t.state, t.value) for t in two.get_trials()}
    # A second resume trains nothing more in either stage.
    assert cli.main(["resume", str(path)]) == 0
    assert capsys.readouterr().out.count("nothing left to run") == 2
    one, two = _studies(results, "rs")
    assert {t.number: (t.state, t.value) for t in two.get_trials()} == finished
    assert len(one.get_trials()) == 3
