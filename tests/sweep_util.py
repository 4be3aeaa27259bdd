"""Shared helpers of the sweep tests: a tiny sweep file (a 3K-parameter model, ~32K tokens per trial)."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml
from ray_cluster_util import descendants

FAULT_ACK = "I am injecting a training fault on purpose"


def tiny_sweep(tmp: Path, name: str = "tiny", *, trials: int = 4, prune: bool = False, retries: int = 0,
               faults: list[dict[str, Any]] | None = None, **extra: Any) -> Path:
    """Write a tiny τ-held LR sweep file into ``tmp`` and return its path (results go to tmp/results)."""
    doc: dict[str, Any] = {
        "name": name,
        "model": {"width": 16, "depth": 1, "heads": 2, "context": 64},
        "tpp": 10,
        "schedule": {"kind": "linear", "warmup": 0.05},
        "tau": "optimal",
        "fixed": {"batch_tokens": 512},
        "space": {"lr": {"type": "float", "low": 1.0e-3, "high": 1.0e-1, "log": True}},
        "trials": trials,
        "sampler": {"name": "qmc", "seed": 0},
        "pruner": {"enabled": prune, "min_fraction": 0.2, "reference": {"online": True, "min_trials": 2}},
        "resources": {"cpu": 1},
        "executor": {"num_cpus": 2},
        "heartbeat": {"interval": 1, "grace": 4},
        "retries": retries,
        "results": str(tmp / "results" / name),
        "train": {"report_every_tokens": 2048, "threads": 1, "val_fractions": [1.0]},
    }
    if faults:
        doc["faults"] = [{"acknowledge": FAULT_ACK, **f} for f in faults]
    doc.update(extra)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def by_state(trials: Iterable[Any]) -> dict[str, list[Any]]:
    """``trials`` grouped by state name."""
    out: dict[str, list[Any]] = {}
    for t in trials:
        out.setdefault(t.state.name, []).append(t)
    return out


def read_trials(storage_url: str, study_name: str, timeout: float = 60.0) -> list[Any]:
    """The study's trials, read only (never creating tables while a driver may be creating them); [] while
    the study does not exist yet. ``timeout``: seconds to wait for SQLite's lock (a short one when the
    writers may be frozen: the read then fails at once instead of waiting for them)."""
    import optuna

    storage = optuna.storages.RDBStorage(storage_url, skip_table_creation=True,
                                         engine_kwargs={"connect_args": {"timeout": timeout}})
    try:
        return optuna.load_study(study_name=study_name, storage=storage).get_trials()
    except KeyError:
        return []
    finally:
        storage.remove_session()
        storage.engine.dispose()


def wait_until_training(driver: Any, storage_url: str, study_name: str, timeout: float = 300.0) -> list[Any]:
    """Poll the study until one of its trials is RUNNING with reports, while the ``driver`` process (a
    ``subprocess.Popen``) runs; returns the trials read then. Fails if the driver ends first or the time
    (seconds) runs out."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        assert driver.poll() is None, f"the driver ended (status {driver.returncode}) before a trial trained"
        assert time.monotonic() < deadline, f"no trial trained within {timeout:.0f} s"
        try:
            trials = read_trials(storage_url, study_name, timeout=1)
        except Exception:  # tables being created
            trials = []
        if any(t.state.name == "RUNNING" and t.intermediate_values for t in trials):
            return trials
        time.sleep(0.2)


def lease_rows(storage_url: str) -> list[tuple[Any, ...]]:
    """The rows (sweep, holder) of the storage's lease table (`collapse_hpo.hpo.sweep.lease`)."""
    import sqlalchemy

    from collapse_hpo.hpo.sweep.lease import TABLE

    engine = sqlalchemy.create_engine(storage_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sqlalchemy.text(f"SELECT sweep, holder FROM {TABLE}"))]
    finally:
        engine.dispose()


def signal_tree(pid: int, sig: signal.Signals, also: Sequence[int] = ()) -> list[int]:
    """Send ``sig`` to ``pid``, every process below it and ``also``; returns the pids signalled."""
    pids = [pid, *descendants(pid), *also]
    for p in dict.fromkeys(pids):
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)
    return pids


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[Callable[[], None]]:
    """Stop a driver and every process below it (Ray's head processes and the trials' workers, which Ray puts
    in sessions of their own, out of reach of ``killpg``) for the block; the function it yields SIGKILLs them
    all, still stopped. What the block reads of the study is then exactly what a kill inside it leaves."""
    stopped = signal_tree(pid, signal.SIGSTOP)
    try:
        yield lambda: signal_tree(pid, signal.SIGKILL, also=stopped)  # stopped processes die too
    finally:
        signal_tree(pid, signal.SIGCONT, also=stopped)
