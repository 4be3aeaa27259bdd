"""`collapse-hpo dashboard SWEEP.yaml` (or `--storage URL`): optuna-dashboard on a sweep's storage.

Before serving, the sweep's study gets a fresh collapsed-curves figure and per-trial prediction notes
(hpo/outputs/dashboard.py ``publish``), so a running sweep shows its current state. Prints the URL, then
serves until Ctrl-C. Listens on 127.0.0.1; another ``--host`` (reachable from other machines) is refused
unless ``--allow-remote`` is given, and is then read-only unless ``--no-read-only``
(hpo/outputs/dashboard_server.py). The host is checked before anything is published.
"""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands._common import no_sweep_results
from collapse_hpo.hpo.commands._study import storage_for, study_names
from collapse_hpo.hpo.extras import require
from collapse_hpo.hpo.outputs.dashboard_server import check_host, remote_warning
from collapse_hpo.hpo.sweep.urls import mask_url, resolve_url, sqlite_file
from collapse_hpo.predictors.errors import InputError

HELP = "start optuna-dashboard on a sweep's storage (with the collapse figure and notes) and print its URL"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The sweep file or a storage URL, and where to listen."""
    parser.add_argument("sweep", nargs="?", default=None,
                        help="the sweep YAML file (its storage is opened); or give --storage")
    parser.add_argument("--storage", metavar="URL", default=None,
                        help="an Optuna storage URL instead of a sweep file (e.g. sqlite:///results/x/study.db)")
    parser.add_argument("--results", metavar="DIR", default=None,
                        help="results folder of the sweep (as given to `run`)")
    parser.add_argument("--no-prune", action="store_true",
                        help="open the sweep's '<name>-noprune' run (as given to `run --no-prune`)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1); one reachable from other machines "
                             "needs --allow-remote (to share a dashboard, prefer an SSH tunnel: "
                             "ssh -L 8080:127.0.0.1:8080 HOST)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host reachable from other machines (no authentication: anyone who "
                             "reaches the port can read the studies); read-only unless --no-read-only")
    parser.add_argument("--read-only", action=argparse.BooleanOptionalAction, default=None,
                        help="refuse every change (POST, PUT, DELETE: notes, deleting studies); default: "
                             "read-only when the host is reachable from other machines")
    parser.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 = any free port)")
    parser.add_argument("--no-publish", action="store_true",
                        help="do not refresh the figure and notes before serving")
    parser.add_argument("--publish-only", action="store_true",
                        help="refresh the figure and notes, print where, and exit without serving")


def run(args: argparse.Namespace) -> int:
    """Locate the storage, publish the review figure and notes, print the URL and serve."""
    if (args.sweep is None) == (args.storage is None):
        raise InputError("dashboard: give a sweep file or --storage URL (one of them)")
    if not 0 <= args.port <= 65535:
        raise InputError(f"dashboard: --port must be in 0..65535, got {args.port}")

    require("the dashboard", "optuna_dashboard", "plotly")

    remote = False if args.publish_only else check_host(args.host, args.allow_remote)
    read_only = remote if args.read_only is None else args.read_only
    import optuna

    from collapse_hpo.hpo.outputs import (  # deferred: pulls numpy; --help stays fast
        dashboard,
        dashboard_server,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    studies: list[optuna.Study] = []
    reference = None
    references: dict[str, object] = {}
    if args.sweep is not None:

        from collapse_hpo.hpo.sweep.config import load_sweep  # deferred: pulls pydantic; --help stays fast
        from collapse_hpo.hpo.sweep.preflight import (
            check_storage,  # deferred: pulls pydantic; --help stays fast
        )
        from collapse_hpo.hpo.sweep.runner import locate  # deferred: pulls pydantic; --help stays fast

        sweep = load_sweep(args.sweep)
        loc = locate(sweep, args.results, no_prune=args.no_prune)
        check_storage(sweep, loc.storage_url, loc.results)
        url = resolve_url(loc.storage_url, f"{sweep.source}: field 'storage'")
        if url.startswith("sqlite") and not _sqlite_file_exists(url):
            raise no_sweep_results(sweep.source, loc.results)
        try:
            if sweep.stages:  # a sweep with stages: both stage studies, stage 2 judged against stage 1
                studies, references = _stage_studies(sweep, args, url)
            else:
                studies = [optuna.load_study(study_name=loc.study_name, storage=url)]
                reference = sweep.pruner.reference.spec(sweep.base_dir())
        except KeyError:
            raise InputError(f"{sweep.source}: no study {loc.study_name!r} in {mask_url(url)} yet: run "
                             f"`collapse-hpo run {sweep.source}` first") from None
    else:
        url = storage_for(args.storage)  # ${NAME} read, the SQLite file must exist, the driver named
        studies = [optuna.load_study(study_name=name, storage=url) for name in study_names(url)]
    if not args.no_publish:
        for study in studies:
            result = dashboard.publish(study, reference=references.get(study.study_name, reference))
            print(f"published to study {study.study_name!r}: figure {result.figure_id!r}, "
                  f"{result.trial_notes} trial note(s) updated; reference: {result.reference}")
    if args.publish_only:
        return 0
    if remote:
        import sys

        print(remote_warning(args.host, args.port, read_only), file=sys.stderr, flush=True)
    try:
        dashboard_server.serve(url, args.host, args.port, read_only=read_only, shown=mask_url(url))
    except KeyboardInterrupt:
        return 0
    return 0


def _stage_studies(sweep, args: argparse.Namespace, url: str) -> tuple[list, dict[str, object]]:
    """The studies of a sweep with stages that exist (KeyError when stage 1 does not) and the reference
    each was judged with: the file's for stage 1, stage 1's study for stage 2 (hpo/sweep/stages.py)."""
    import optuna

    from collapse_hpo.hpo.sweep.stages import stage_locations  # deferred: pulls pydantic; --help stays fast

    locs = stage_locations(sweep, args.results, no_prune=args.no_prune)
    studies = [optuna.load_study(study_name=locs[0].study_name, storage=url)]
    references: dict[str, object] = {locs[0].study_name: sweep.pruner.reference.spec(sweep.base_dir())}
    if locs[1].study_name in optuna.get_all_study_names(url):
        studies.append(optuna.load_study(study_name=locs[1].study_name, storage=url))
        references[locs[1].study_name] = {"study": locs[0].study_name, "storage": url}
    return studies, references


def _sqlite_file_exists(url: str) -> bool:
    """Whether the file of a sqlite:/// URL exists."""
    path = sqlite_file(url)
    return path is not None and path.is_file()
