"""The end of a sweep (`run`, `resume`, `report` and each stage of `stages:`): the report files, the
dashboard figure, the table, and the exit status."""

from __future__ import annotations

from collapse_hpo.hpo.extras import missing_note
from collapse_hpo.hpo.sweep.stop import stopped_line


def finish(study, sweep, loc, stop_signal: int | None = None) -> int:
    """Write the report files, publish the dashboard figure and notes, print the table and the summary.

    Returns the exit status: 0; 128 + ``stop_signal`` when a signal stopped the sweep (Ctrl-C 130, SIGTERM
    143, SIGHUP 129: hpo/sweep/stop.py), with one line on stderr saying so; or 1 when every trial of the sweep
    FAILed (one line): such a sweep found nothing and must not look like a success to a script or CI."""
    import sys

    from collapse_hpo.hpo.outputs.report import write_report  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.hpo.sweep.runner import (  # deferred: pulls pydantic; --help stays fast
        all_failed,
        unpruned_tokens,
    )

    table, lines = write_report(study, loc.results, unpruned_tokens(sweep, study), sweep.reference_path(),
                                title=loc.study_name)
    print(table)
    for line in lines:
        print(line)
    note = publish_dashboard(study, sweep, loc)
    if note:
        print(note)
    if stop_signal is not None:
        print(f"collapse-hpo: {sweep.source}: {stopped_line(stop_signal, sweep.source)}", file=sys.stderr)
        return 128 + stop_signal
    failed = all_failed(study)
    if failed is not None:
        print(f"collapse-hpo: error: {sweep.source}: {failed}", file=sys.stderr)
        return 1
    return 0


def publish_dashboard(study, sweep, loc) -> str:
    """Publish the study figure and per-trial notes to optuna-dashboard (hpo/outputs/dashboard.py), if
    present."""
    import importlib.util

    if importlib.util.find_spec("collapse_hpo.hpo.outputs.dashboard") is None:
        return ""

    absent = missing_note("the dashboard", "optuna_dashboard", "plotly")
    if absent is not None:
        return f"dashboard: not published ({absent})"
    from collapse_hpo.hpo.outputs import dashboard  # deferred: pulls numpy; --help stays fast

    fn = getattr(dashboard, "publish", None)
    if fn is None:
        return ""
    try:
        fn(study, reference=sweep.pruner.reference.spec(sweep.base_dir()))
    except Exception as err:  # the results are written already; a dashboard problem must not fail the sweep
        return f"dashboard: not published ({type(err).__name__}: {err})"
    flag = " --no-prune" if loc.study_name.endswith("-noprune") else ""
    return f"dashboard: figure and notes published; review with `collapse-hpo dashboard {sweep.source}{flag}`"
