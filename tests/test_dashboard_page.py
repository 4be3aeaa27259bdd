"""The dashboard's study page (hpo/outputs/dashboard_page.py): the collapse figure first and at full width,
its legend outside the data, and the reference surrogate as a one-line summary instead of its raw JSON (issue
21).

A real 20-trial study (plain Optuna objective, the CollapsePruner, trials at three τ: a legend of 23
entries, taller than the plot) is served by the real `collapse-hpo dashboard` and read by Debian's
headless Chromium: a screenshot of the first 1000 px and the rendered DOM.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from wsgiref.util import setup_testing_defaults

import optuna
import pytest
from browser_util import chromium, need_chromium, served, trial_pixels

from collapse_hpo.hpo.optuna_side.pruner import CollapsePruner
from collapse_hpo.hpo.outputs import dashboard
from collapse_hpo.hpo.outputs.dashboard_page import PAGE_STYLE, PLOT_ELEMENT, page_app, reference_summary
from collapse_hpo.hpo.rule.record import USED_REFERENCE_ATTR, set_trial_controls
from collapse_hpo.predictors.schedules import Schedule
from collapse_hpo.predictors.surrogate import ErrorBand, Surrogate

SURROGATE = Surrogate(
    b_c=0.5, b_e=0.3, q_c=1.0, q_e=0.1,
    error_bands=[ErrorBand(fraction=f, n=12, bias=0.0, scale=0.01, max_abs=0.03) for f in (0.1, 0.2, 0.3)],
    reference={"tau": [0.05, 0.4], "tpp": [10.0, 80.0]}, info={"n_curves": 12},
)
TOTAL, TPP = 1_000_000, 20.0
TAUS = (0.1, 0.2, 0.3)


def _objective(trial: optuna.Trial) -> float:
    lr = trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    tau = TAUS[trial.number % len(TAUS)]
    set_trial_controls(trial, total_tokens=TOTAL, schedule="linear", tau=tau, tpp=TPP)
    final = 3.0 + 0.8 * (math.log10(lr) + 2.0) ** 2
    loss = math.nan
    for tokens in range(TOTAL // 10, TOTAL + 1, TOTAL // 10):
        loss = final * float(SURROGATE.normalized(tokens / TOTAL, Schedule(), tau, TPP)[0])
        trial.report(loss, step=tokens)
        if trial.should_prune():
            raise optuna.TrialPruned()
    return loss


@pytest.fixture(scope="module")
def study_url(tmp_path_factory):
    """A finished 20-trial study in a SQLite file, with the figure and notes published."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path_factory.mktemp('page') / 'study.db'}"
    memory = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=memory, study_name="page", sampler=optuna.samplers.RandomSampler(1),
                                pruner=CollapsePruner(reference=SURROGATE, min_fraction=0.2))
    study.optimize(_objective, n_trials=20)
    optuna.copy_study(from_study_name="page", from_storage=memory, to_storage=url)
    study = optuna.load_study(study_name="page", storage=url)
    assert isinstance(study.user_attrs[USED_REFERENCE_ATTR], dict)
    dashboard.publish(study)
    return url


def test_reference_summary_gives_the_constants_ranges_and_curves():
    value = {"label": "file:surrogate.json", "surrogate": SURROGATE.to_dict()}
    text = reference_summary(USED_REFERENCE_ATTR, value)
    assert text == ("reference file:surrogate.json: b = 0.5·τ^0.3, q = 1·TPP^0.1, m = 0.05; fitted on 12 "
                    "curves (τ 0.05–0.4, TPP 10–80); error model at t̂ 0.1–0.3")
    online = reference_summary("collapse_reference", {"trials": [0, 2, 5, 7],
                                                      "surrogate": SURROGATE.to_dict()})
    assert online.startswith("online fit on 4 completed trial(s) (0, 2, 5, 7): b = 0.5·τ^0.3")
    assert reference_summary("lr", value) is None  # other attrs are shown as they are
    assert reference_summary(USED_REFERENCE_ATTR, {"surrogate": {"format": "other"}}) is None


def _get(app, path: str) -> tuple[str, dict[str, str], bytes]:
    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET"}
    setup_testing_defaults(environ)
    seen = {}

    def start_response(status, headers, exc_info=None):
        seen["status"], seen["headers"] = status, dict(headers)
        return lambda data: None

    body = b"".join(app(environ, start_response))
    return seen["status"], seen["headers"], body


def test_page_app_rewrites_the_page_and_the_study_json_only(study_url):
    import optuna_dashboard

    app = page_app(optuna_dashboard.wsgi(study_url), study_url)
    status, headers, html = _get(app, "/dashboard/studies/1")
    assert status.startswith("200") and PAGE_STYLE.encode() in html
    assert int(headers["Content-Length"]) == len(html)
    status, headers, body = _get(app, "/api/studies/1")
    attrs = {a["key"]: a["value"] for a in json.loads(body)["user_attrs"]}
    assert attrs[USED_REFERENCE_ATTR].startswith("reference surrogate: b = 0.5·τ^0.3, q = 1·TPP^0.1")
    assert "fitted on 12 curves (τ 0.05–0.4, TPP 10–80)" in attrs[USED_REFERENCE_ATTR]
    assert int(headers["Content-Length"]) == len(body)
    stored = optuna.load_study(study_name="page", storage=study_url).user_attrs[USED_REFERENCE_ATTR]
    assert stored["surrogate"]["b_c"] == 0.5  # the study itself is unchanged
    _, _, studies = _get(app, "/api/studies")  # anything else passes through as it is
    assert json.loads(studies)["study_summaries"][0]["study_name"] == "page"


@pytest.mark.slow
def test_study_page_shows_the_figure_first_at_full_width_with_the_legend_beside_the_data(study_url, tmp_path):
    need_chromium()
    with served(study_url, "--no-publish") as (url, _):
        page = f"{url}studies/1"
        # above the fold: a 1400 x 1000 window shows the curves, across the page's width
        shot = Path(os.environ.get("COLLAPSE_HPO_SHOT_DIR", tmp_path)) / "dashboard_study_page.png"
        chromium(["--virtual-time-budget=20000", "--window-size=1400,1000", f"--screenshot={shot}", page],
                 str(tmp_path / "p1"))
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert trial_pixels(shot, (150, 60, 700, 1000)) >= 200  # left half of the page, first 1000 px
        assert trial_pixels(shot, (700, 60, 1050, 1000)) >= 200  # and its right half: full width

        dom = chromium(["--virtual-time-budget=20000", "--window-size=1400,1000", "--dump-dom", page],
                       str(tmp_path / "p2"))
        html = dom.stdout.decode("utf-8", "replace")
        element = re.search(rf'<div[^>]*\bid="{re.escape(PLOT_ELEMENT)}"', html)  # not the page's style sheet
        assert element, dom.stderr.decode()[-2000:]
        figure = html[element.start():]
        width = float(re.search(r'<svg class="main-svg"[^>]* width="([\d.]+)"', figure).group(1))
        assert width >= 1100  # the page's content width at 1400 px (half of it before)
        drag = re.search(r'<rect class="nsewdrag drag"[^>]* x="([\d.]+)"[^>]* width="([\d.]+)"', figure)
        legend_x = float(re.search(r'<g class="legend"[^>]*transform="translate\(([\d.]+),', figure).group(1))
        assert legend_x >= float(drag.group(1)) + float(drag.group(2))  # the legend starts right of the data
        assert figure.count("trace scatter") >= 20  # every trial's curve is drawn
        assert "reference surrogate: b = 0.5·τ^0.3, q = 1·TPP^0.1, m = 0.05; fitted on 12 curves" in html
        assert "collapse-hpo-surrogate" not in html  # no raw surrogate JSON on the page
