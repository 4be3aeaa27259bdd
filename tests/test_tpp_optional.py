"""TPP optional (issue 15): an empty ``tpp`` means "not defined" (``tpp`` None), as for a fine-tuning run.

Covered end to end: the curve CSV (read and write), `collapse-hpo calibrate` (q(TPP) held constant, said in
the notes), `collapse-hpo predict` and `collapse-hpo replay` (collapse with a calibrated surrogate and
collapse-online) on a CSV whose tpp column is empty; files that mix runs with and without a tpp; the decision
rule's control comparison; the Python API (CollapsePruner and CollapseScheduler with ``tpp=None``); the
scaling-law code, which needs D = TPP · N and says so; and a tiny real sweep that gives total_tokens.
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import optuna
import pytest

from collapse_hpo.hpo.cli import main
from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner, set_trial_controls
from collapse_hpo.hpo.rule.decision import Competitor, PruneSettings, decide, same_controls
from collapse_hpo.hpo.rule.record import STUDY_REFERENCE_ATTR, TrialControls, trial_curve
from collapse_hpo.hpo.rule.reference import fit_surrogate
from collapse_hpo.predictors.calibrate import calibrate
from collapse_hpo.predictors.curves import Curve, read_curves_csv, write_curves_csv
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.forecast import forecast
from collapse_hpo.predictors.predict import predict_final_loss
from collapse_hpo.predictors.scaling_law import fit_scaling_law
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate
from collapse_hpo.predictors.synthetic import TRUE_SURROGATE, synthetic_curves

optuna.logging.set_verbosity(optuna.logging.WARNING)

#: The truth of a fine-tuning family: b(τ) a power law, q a constant (no TPP to depend on).
TRUTH = Surrogate(b_c=0.5, b_e=0.3, q_c=1.3, q_e=0.0, tpp_law="constant")
SCHEDULE = Schedule()
HEADER = "run,t_hat,loss,lr,tau,tpp\n"


def finetune(taus=(0.05, 0.1, 0.2), seeds=2, seed=1, n_points=40) -> list[Curve]:
    """Curves of runs without a TPP (tpp None), one per (τ, seed), final losses 3 ± 10%."""
    return synthetic_curves(TRUTH, taus=taus, tpps=(None,), seeds=seeds, n_points=n_points, seed=seed)


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------------------------------- CSV
def test_empty_tpp_reads_as_not_defined_and_is_written_back_empty(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "a,0.1,3.5,1,0.1,\na,1.0,3.0,0.5,0.1,\nb,0.1,3.6,1,,20\nb,1.0,3.1,0.5,,20\n")
    a, b = read_curves_csv(p)
    assert a.tpp is None and b.tpp == 20.0
    write_curves_csv(tmp_path / "back.csv", [a, b])
    rows = list(csv.DictReader((tmp_path / "back.csv").open()))
    assert [r["tpp"] for r in rows] == ["", "", "20.0", "20.0"]
    again = read_curves_csv(tmp_path / "back.csv")
    assert again[0].tpp is None and again[1].tpp == 20.0
    assert Curve("c", np.array([0.5, 1.0]), np.array([3.2, 3.0])).tpp is None  # the default: not defined


def test_tpp_that_is_empty_on_some_rows_of_a_run_is_refused(tmp_path):
    p = tmp_path / "c.csv"
    p.write_text(HEADER + "a,0.1,3.5,1,0.1,20\na,1.0,3.0,0.5,0.1,\n")
    with pytest.raises(InputError, match=r"line 3: column 'tpp' changes within run 'a' \(line 2 has 20"):
        read_curves_csv(p)
    p.write_text(HEADER + "a,0.1,3.5,1,0.1,\na,1.0,3.0,0.5,0.1,20\n")
    with pytest.raises(InputError, match=r"line 3: column 'tpp' changes within run 'a' \(line 2 has it emp"):
        read_curves_csv(p)
    p.write_text(HEADER + "a,0.1,3.5,1,0.1,-3\n")
    with pytest.raises(InputError, match="or leave it empty when the run has no TPP"):
        read_curves_csv(p)


# ---------------------------------------------------------------------------------------------- CLI
def test_calibrate_predict_and_replay_read_a_csv_with_empty_tpp(tmp_path, capsys):
    ref, sweep = tmp_path / "ref.csv", tmp_path / "sweep.csv"
    write_curves_csv(ref, finetune(seed=1))
    write_curves_csv(sweep, finetune(taus=(0.05, 0.1, 0.2, 0.4), seeds=2, seed=2, n_points=30))
    assert all(r["tpp"] == "" for r in csv.DictReader(sweep.open()))
    surrogate = tmp_path / "s.json"

    code, out, _ = cli(["calibrate", str(ref), "-o", str(surrogate)], capsys)
    assert code == 0, out
    assert "note: tpp not defined for 6 runs: q(TPP) held constant" in out
    s = Surrogate.load(surrogate)
    assert s.tpp_law == "constant" and s.q_e == 0.0 and "tpp" not in s.reference
    assert s.tau_law == "power" and s.b_e == pytest.approx(0.3, abs=0.1)
    assert any("tpp not defined" in n for n in s.info["notes"])

    code, out, _ = cli(["predict", str(sweep), "--surrogate", str(surrogate), "--fraction", "0.2", "--json"],
                       capsys)
    assert code == 0
    rows = [json.loads(line) for line in out.splitlines()]
    assert len(rows) == 8 and all(r["reason"] is None for r in rows)
    assert max(abs(r["error"]) for r in rows) < 0.02

    table = tmp_path / "replay.csv"
    code, out, err = cli(["replay", str(sweep), "--surrogate", str(surrogate), "--pruner", "collapse",
                          "--pruner", "collapse-online", "--pruner", "none", "--orders", "1",
                          "--workers", "2", "--csv", str(table)], capsys)
    assert code == 0, err
    got = {r["pruner"]: r for r in csv.DictReader(table.open())}
    assert set(got) == {"collapse", "collapse-online", "none"}
    assert float(got["none"]["compute"]) == 1.0
    for name in ("collapse", "collapse-online"):
        assert float(got[name]["compute"]) < 0.9, got[name]  # it judged the trials and stopped some
        assert float(got[name]["best_pruned_rate"]) == 0.0


def test_calibrate_refuses_a_file_that_mixes_runs_with_and_without_tpp(tmp_path, capsys):
    mixed = finetune(seed=1) + synthetic_curves(TRUE_SURROGATE, taus=(0.1,), tpps=(20.0, 80.0), n_points=40)
    path, out_path = tmp_path / "mixed.csv", tmp_path / "s.json"
    write_curves_csv(path, mixed)
    code, _, err = cli(["calibrate", str(path), "-o", str(out_path)], capsys)
    assert code == 2 and not out_path.exists()
    line = err.strip()
    assert "\n" not in line and str(path) in line
    assert "6 of 8 runs have no tpp" in line and "tau0.05_tppnone_s0" in line
    assert "calibrate them separately, or leave tpp empty for every run" in line
    # The online reference of a live sweep calls the same calibration: a mixed set of completed trials gives
    # no surrogate, with this reason (hpo/rule/reference.py), and trials of equal controls are still compared.
    with pytest.raises(InputError, match=r"have no tpp .* and the others have one"):
        fit_surrogate(mixed)


def test_predict_on_a_mixed_file_says_which_runs_a_tpp_law_cannot_serve(tmp_path, capsys):
    """A surrogate with a power law in TPP predicts the runs with a tpp and names the ones without; a
    surrogate calibrated without TPP (q constant) predicts every run."""
    mixed = finetune(taus=(0.1,), seeds=1) + synthetic_curves(TRUE_SURROGATE, taus=(0.1,), tpps=(20.0,),
                                                              n_points=40)
    path = tmp_path / "mixed.csv"
    write_curves_csv(path, mixed)
    fast = {"free_m": False, "folds": 2}
    power = tmp_path / "power.json"
    pretraining = synthetic_curves(taus=(0.05, 0.2), tpps=(20.0, 80.0), n_points=40)
    calibrate(pretraining, **fast).surrogate.save(power)
    flat = tmp_path / "flat.json"
    calibrate(finetune(), **fast).surrogate.save(flat)
    predict = ["predict", str(path), "--fraction", "0.3", "--json", "--surrogate"]
    code, out, _ = cli([*predict, str(power)], capsys)
    rows = {r["run"]: r for r in map(json.loads, out.splitlines())}
    assert code == 0
    assert rows["tau0.1_tpp20_s0"]["reason"] is None
    assert "q depends on TPP" in rows["tau0.1_tppnone_s0"]["reason"]
    assert "tpp is not defined (tpp empty)" in rows["tau0.1_tppnone_s0"]["reason"]
    code, out, _ = cli([*predict, str(flat)], capsys)
    assert code == 0 and all(json.loads(r)["reason"] is None for r in out.splitlines())


def test_an_old_surrogate_file_still_loads_and_serves_runs_without_tpp(tmp_path):
    """The JSON format is unchanged: a file with only the law constants (the oldest kind) loads; with a
    constant q it predicts a run without a TPP, with a TPP law it says why it cannot."""
    for law, ok in (("constant", True), ("power", False)):
        p = tmp_path / f"{law}.json"
        p.write_text(json.dumps({"format": "collapse-hpo-surrogate", "version": 1, "b_c": 0.5, "b_e": 0.3,
                                 "q_c": 1.3, "q_e": 0.0 if law == "constant" else 0.1, "tpp_law": law}))
        s = Surrogate.load(p)
        c = finetune(taus=(0.1,), seeds=1)[0]
        pred = predict_final_loss(c.t_hat[c.t_hat <= 0.3], c.loss[c.t_hat <= 0.3], surrogate=s,
                                  schedule=c.schedule, tau=c.tau, tpp=None)
        assert pred.ok is ok, pred.reason
        if not ok:
            assert "q depends on TPP" in pred.reason


def test_monitor_reads_runs_without_tpp_and_names_the_run_a_tpp_law_cannot_serve(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    write_curves_csv(path, finetune(taus=(0.1,), seeds=1))
    flat, power = tmp_path / "flat.json", tmp_path / "power.json"
    TRUTH.save(flat)
    TRUE_SURROGATE.save(power)
    code, out, _ = cli(["monitor", str(path), "--surrogate", str(flat)], capsys)
    assert code == 0 and "tau0.1_tppnone_s0" in out and "no alarm" in out
    code, _, err = cli(["monitor", str(path), "--surrogate", str(power)], capsys)
    assert code == 2 and "\n" not in err.strip()
    assert f"{path}: run 'tau0.1_tppnone_s0': q depends on TPP" in err


# ---------------------------------------------------------------------------------------------- the rule
def test_same_controls_none_equals_none_and_differs_from_a_number():
    t = tuple(np.linspace(0.05, 0.5, 10))
    theirs = {tpp: Competitor(final_loss=3.0, t_hat=t, loss=t, schedule=SCHEDULE, tau=0.1, tpp=tpp)
              for tpp in (None, 20.0)}
    assert same_controls(SCHEDULE, 0.1, None, theirs[None])
    assert not same_controls(SCHEDULE, 0.1, None, theirs[20.0])
    assert not same_controls(SCHEDULE, 0.1, 20.0, theirs[None])
    assert same_controls(SCHEDULE, 0.1, 20.1, theirs[20.0])


def test_decide_compares_trials_without_tpp_by_their_loss_ratio():
    """Two runs without a TPP at equal τ are equal controls: the worse one is pruned by the loss ratio,
    with or without a surrogate (and a TPP-law surrogate that cannot predict it does not crash the rule)."""
    t = np.linspace(0.025, 1.0, 40)
    shape = np.asarray(TRUTH.normalized(t, SCHEDULE, 0.1, None), dtype=float)
    best = Competitor.from_reports(t, 3.0 * shape, final_loss=3.0, schedule=SCHEDULE, tau=0.1, tpp=None)
    upto = t <= 0.3
    settings = PruneSettings(min_fraction=0.2)
    bands = [ErrorBand(fraction=0.1, n=20, bias=0.0, scale=0.01, max_abs=0.03)]
    for surrogate in (None, Surrogate(b_c=0.5, b_e=0.3, q_c=1.3, q_e=0.0, tpp_law="constant",
                                      error_bands=bands)):
        d = decide(t[upto], 3.3 * shape[upto], surrogate=surrogate, schedule=SCHEDULE, tau=0.1, tpp=None,
                   competitors=[best], settings=settings)
        assert d.prune and "loss ratio" in d.reason, d.reason
    d = decide(t[upto], 3.3 * shape[upto], surrogate=TRUE_SURROGATE, schedule=SCHEDULE, tau=0.1, tpp=None,
               competitors=[best], settings=settings)
    assert not d.prune and "q depends on TPP" in d.reason


# ---------------------------------------------------------------------------------------------- Python API
def test_trial_record_keeps_tpp_none_as_not_defined():
    study = optuna.create_study()
    trial = study.ask()
    set_trial_controls(trial, total_tokens=1000, tau=0.1, tpp=None)
    attrs = study.trials[0].user_attrs
    assert attrs["tpp"] is None
    # An explicit None in the record overrides a default number: "not defined" is a value, not "unknown".
    assert TrialControls(tpp=20.0).merged(attrs, "t").tpp is None
    trial.report(3.0, step=500)
    trial.report(2.9, step=1000)
    curve = trial_curve(study.trials[0], TrialControls())
    assert curve is not None and curve.tpp is None


TOTAL, REPORTS = 400_000, 40


def _objective(trial: optuna.trial.Trial) -> float:
    """Fine-tuning runs: τ differs per trial (two values), no TPP; the final loss is best at x = 0.3."""
    x = trial.suggest_float("x", 0.0, 1.0)
    tau = 0.05 if trial.number % 2 else 0.2
    set_trial_controls(trial, total_tokens=TOTAL, schedule=SCHEDULE, tau=tau, tpp=None)
    rng = np.random.default_rng(trial.number)
    final = 3.0 + 2.0 * (x - 0.3) ** 2
    loss = math.nan
    for i in range(1, REPORTS + 1):
        tokens = TOTAL * i // REPORTS
        shape = float(TRUTH.normalized(tokens / TOTAL, SCHEDULE, tau, None)[0])
        loss = final * shape * (1.0 + 0.002 * float(rng.standard_normal()))
        trial.report(loss, step=tokens)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss


def test_collapse_pruner_with_tpp_none_calibrates_online_and_prunes():
    # Inline refits: the test reads the fitted surrogate right after optimize(); a background refit may
    # still be running then (a sweep-timing race, not what this test is about).
    pruner = CollapsePruner(reference={"online": True, "min_trials": 3, "refit": "inline", "prior": "none"},
                            total_tokens=TOTAL, tpp=None,
                            min_fraction=0.2)
    study = optuna.create_study(pruner=pruner, sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(_objective, n_trials=12)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.PRUNED) >= 3
    best = min(study.trials, key=lambda t: 3.0 + 2.0 * (t.params["x"] - 0.3) ** 2)
    assert best.state == optuna.trial.TrialState.COMPLETE
    fitted = Surrogate.from_dict(study.user_attrs[STUDY_REFERENCE_ATTR]["surrogate"])
    assert fitted.tpp_law == "constant" and "tpp" not in fitted.reference
    assert any("tpp not defined" in n for n in fitted.info["notes"])
    assert all("tpp not defined" not in (t.user_attrs.get("prune_reason") or "") for t in study.trials)


def test_collapse_scheduler_with_tpp_none_prunes_the_bad_trial(tmp_path):
    from ray.tune.schedulers import TrialScheduler

    from collapse_hpo.hpo.ray_side.scheduler import CollapseScheduler

    class FakeTrial:
        def __init__(self, trial_id: str) -> None:
            self.trial_id, self.config, self.status = trial_id, {}, "RUNNING"
            self.max_failures, self.failures = 0, 0

        def should_recover(self) -> bool:
            return False

    surrogate = calibrate(finetune(), free_m=False, folds=2).surrogate
    s = CollapseScheduler(reference=surrogate, tau=0.1, tpp=None, state_path=tmp_path / "state.json",
                          settings=PruneSettings(min_fraction=0.2))
    assert s.set_search_properties(None, None)
    stopped = {}
    for name, final in (("good", 3.0), ("bad", 3.6)):
        trial = FakeTrial(name)
        s.on_trial_add(None, trial)
        stopped[name] = None
        for i in range(1, 21):
            t = i / 20
            result = {"loss": final * float(TRUTH.normalized(t, SCHEDULE, 0.1, None)[0]), "t_hat": t}
            if s.on_trial_result(None, trial, result) == TrialScheduler.STOP:
                stopped[name] = t
                break
        s.on_trial_complete(None, trial, result)
    assert stopped["good"] is None and stopped["bad"] is not None and stopped["bad"] < 0.5
    assert s.records["bad"].tpp is None
    # The state on disk (snapshot + journal) keeps "not defined" as it is.
    stored = CollapseScheduler.load_state(tmp_path / "state.json")
    assert stored["bad"].tpp is None and stored["bad"].status == "pruned"


# ---------------------------------------------------------------------------------------------- scaling law
def test_scaling_law_says_it_needs_tpp_and_what_to_pass(tmp_path):
    curves = finetune(taus=(0.1,), seeds=3)
    for c, n in zip(curves, (1e6, 4e6, 16e6)):
        c.params = n
    cal = calibrate(curves, groups=[c.run for c in curves])
    assert cal.surrogate.scaling_law is None
    note = next(n for n in cal.notes if n.startswith("no scaling law"))
    assert "tpp not defined for 3 run(s)" in note and "give tpp (training tokens / params)" in note
    with pytest.raises(InputError, match=r"and each run's tpp \(the law needs training tokens D = tpp \* N"):
        forecast(cal.surrogate, params=1e6, tokens=2e7)
    with pytest.raises(InputError, match=r"tokens value must be .* nan at run 1; give the training tokens"):
        fit_scaling_law([1e6, 4e6, 16e6], [2e7, math.nan, 3e8], [3.0, 2.8, 2.6])


# ---------------------------------------------------------------------------------------------- a real sweep
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_total_tokens_sweep_trains_records_no_tpp_and_its_curves_replay(tmp_path, capsys):
    """A tiny real sweep that gives total_tokens (no tpp) and a τ: its trials record tpp None, the online
    reference serves them, and the curves.csv `report` writes (tpp empty) calibrates."""
    import yaml
    from sweep_util import tiny_sweep

    from collapse_hpo.hpo.sweep.config import load_sweep
    from collapse_hpo.hpo.sweep.runner import create_study, locate
    from collapse_hpo.hpo.sweep.trial import run_trial, trial_config

    path = tiny_sweep(tmp_path, "ft", trials=4, prune=True, tau=0.2, total_tokens=16_384)  # a 3K model
    doc = yaml.safe_load(path.read_text())
    del doc["tpp"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    sweep = load_sweep(path)
    loc = locate(sweep, no_prune=False)
    loc.results.mkdir(parents=True)
    study = create_study(sweep, loc)
    dists = {k: d.to_optuna() for k, d in sweep.space.items()}
    while study.get_trials(states=(optuna.trial.TrialState.WAITING,)):
        trial = study.ask(dists)
        run_trial(trial_config(sweep, loc.storage_url, loc.study_name, trial.number, loc.prune, loc.results))
    trials = optuna.load_study(study_name=loc.study_name, storage=loc.storage_url).get_trials()
    assert len(trials) == 4 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    for t in trials:
        assert t.user_attrs["tpp"] is None and t.user_attrs["total_tokens"] == 16_384
        assert t.user_attrs["tau"] == pytest.approx(0.2)
        assert "tpp not defined, and" not in (t.user_attrs.get("prune_reason") or "")
    judged = [t for t in trials if t.number >= 2]  # the online reference needs 2 completed trials
    assert any("predicted final loss" in (t.user_attrs.get("prune_reason") or "") for t in judged)
    assert main(["report", str(path)]) == 0
    curves = loc.results / "curves.csv"
    assert all(r["tpp"] == "" for r in csv.DictReader(curves.open()))
    complete = [c for c in read_curves_csv(curves) if c.complete]
    assert len(complete) >= 2 and all(c.tpp is None for c in complete)
    ref = tmp_path / "complete.csv"
    write_curves_csv(ref, complete)
    capsys.readouterr()
    code, out, _ = cli(["calibrate", str(ref), "-o", str(tmp_path / "s.json"), "--folds", "2"], capsys)
    assert code == 0 and f"tpp not defined for {len(complete)} runs: q(TPP) held constant" in out
