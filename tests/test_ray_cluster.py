"""A sweep on a real two-node Ray cluster with PostgreSQL storage, and a worker node that dies mid-sweep.

The cluster is two real raylets on this machine (`ray start --head` and `ray start --address=...` with its
own `--resources` label, 1 CPU each, tests/ray_cluster_util.py). `collapse-hpo run` runs on the head as a
user would run it, with `executor: {address: auto}` and the study in PostgreSQL. Each trial process writes
the id of its Ray node to the study (`ray_node_id`). Once the second node has finished a trial and is in
the middle of training another, its raylet is SIGKILLed: that trial must end FAIL and be retried on the
head node, and every draw must end exactly once COMPLETE, with nothing lost or run twice.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from ray_cluster_util import LocalRayCluster
from sweep_util import tiny_sweep

from collapse_hpo.hpo.sweep.trial import RAY_NODE_ATTR, storage_url

POSTGRES = "postgresql://postgres@127.0.0.1:5432/test"
# A trial takes 1-3 s once Ray's actors are warm (the first one on each node 10-20 s), and the nodes start
# their first trials seconds apart: with 12 draws the second node runs several trials whichever starts first.
DRAWS = 12
SECOND = "node_b"  # the custom resource that labels the second node


def _postgres_available() -> bool:
    try:
        import psycopg

        psycopg.connect(POSTGRES, connect_timeout=3).close()
        return True
    except Exception:
        return False


@pytest.fixture
def cluster() -> Iterator[LocalRayCluster]:
    """A two-node cluster's owner; whatever the test started is stopped afterwards, also on failure."""
    root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths must stay < 108 chars
    c = LocalRayCluster(root)
    try:
        yield c
    finally:
        left = c.stop()
        shutil.rmtree(root, ignore_errors=True)
        assert not left, f"Ray processes of the test cluster still alive after stop: {left}"


@pytest.fixture
def study() -> Iterator[tuple[str, optuna.storages.RDBStorage]]:
    """A unique study name in the PostgreSQL test database and a storage to read it; the study is deleted
    afterwards."""
    if not _postgres_available():
        pytest.skip(f"PostgreSQL not reachable at {POSTGRES}")
    name = f"cluster-{uuid.uuid4().hex[:10]}"
    storage = optuna.storages.RDBStorage(storage_url(POSTGRES))
    try:
        yield name, storage
    finally:
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=name, storage=storage)
        storage.remove_session()
        storage.engine.dispose()


def _trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return study.get_trials(deepcopy=False)


def _early(trial: optuna.trial.FrozenTrial) -> bool:
    """True when the trial has reported and is in the first half of its training (far from its end)."""
    total = trial.user_attrs.get("total_tokens")
    return bool(trial.intermediate_values) and isinstance(total, int) and \
        max(trial.intermediate_values) <= total // 2


def _kill_second_node_mid_trial(cluster: LocalRayCluster, driver: subprocess.Popen[bytes], storage: Any,
                                study_name: str, second_id: str, timeout: float) -> int:
    """Once the second node has finished a trial and is early in its next one, SIGKILL its raylet and
    workers (the machine dies).

    Returns the number of the trial it was running. Fails the test when the driver ends first."""
    deadline = time.monotonic() + timeout
    study = None
    while time.monotonic() < deadline:
        if driver.poll() is not None:
            pytest.fail(f"the sweep ended (exit {driver.returncode}) before the second node ran two trials")
        if study is None:
            try:
                study = optuna.load_study(study_name=study_name, storage=storage)
            except KeyError:
                time.sleep(0.5)
                continue
        on_second = [t for t in _trials(study) if t.user_attrs.get(RAY_NODE_ATTR) == second_id]
        done = [t for t in on_second if t.state == optuna.trial.TrialState.COMPLETE]
        running = [t for t in on_second if t.state == optuna.trial.TrialState.RUNNING and _early(t)]
        if done and running:
            cluster.kill_node(cluster.nodes[1])
            return running[0].number
        time.sleep(0.2)
    pytest.fail(f"the second node did not run two trials within {timeout} s")


def _timeline(trials: list[optuna.trial.FrozenTrial], names: dict[str, str], killed: int) -> str:
    """One line per trial: number, draw, node, state, start and end (s after the first start)."""
    t0 = min(t.datetime_start for t in trials if t.datetime_start)
    lines = []
    for t in trials:
        start = (t.datetime_start - t0).total_seconds() if t.datetime_start else float("nan")
        end = (t.datetime_complete - t0).total_seconds() if t.datetime_complete else float("nan")
        node = names.get(t.user_attrs.get(RAY_NODE_ATTR), "?")
        mark = "  <- its node was killed" if t.number == killed else ""
        lines.append(f"trial {t.number} draw {t.user_attrs.get('draw')} on {node}: {t.state.name} "
                     f"{start:.1f}-{end:.1f} s{mark}")
    return "\n".join(lines)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sweep_on_two_nodes_survives_losing_one(cluster: LocalRayCluster,
                                                study: tuple[str, optuna.storages.RDBStorage],
                                                tmp_path: Path) -> None:
    study_name, storage = study
    cluster.start_head(num_cpus=1)
    cluster.add_node("second", num_cpus=1, resources={SECOND: 1})
    nodes = cluster.wait_nodes(2)
    second_id = next(n["id"] for n in nodes if SECOND in n["resources"])
    head_id = next(n["id"] for n in nodes if n["id"] != second_id)

    path = tiny_sweep(tmp_path, study_name, trials=DRAWS, retries=1, storage=POSTGRES,
                      executor={"address": "auto"}, heartbeat={"interval": 1, "grace": 10})
    log = tmp_path / "driver.log"
    started = time.monotonic()
    with open(log, "wb") as fh:
        driver = subprocess.Popen([str(Path(sys.executable).with_name("collapse-hpo")), "run", str(path)],
                                  stdout=fh, stderr=subprocess.STDOUT, env=cluster.env())
    try:
        killed = _kill_second_node_mid_trial(cluster, driver, storage, study_name, second_id, timeout=150)
        code = driver.wait(timeout=150)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    output = log.read_text(errors="replace")
    assert code == 0, output[-3000:]
    wall = time.monotonic() - started

    trials = _trials(optuna.load_study(study_name=study_name, storage=storage))
    by_number = {t.number: t for t in trials}
    TS = optuna.trial.TrialState
    # Trials ran on both nodes, each recorded by the trial process itself.
    ran_on = {t.number: t.user_attrs.get(RAY_NODE_ATTR) for t in trials}
    print(_timeline(trials, {head_id: "head", second_id: "second"}, killed), f"wall {wall:.0f} s")
    assert set(ran_on.values()) == {head_id, second_id}, (ran_on, output[-3000:])
    assert any(ran_on[t.number] == second_id for t in trials if t.state == TS.COMPLETE)
    # The trial on the killed node failed with the driver's reason and was retried once, on the head node.
    lost = by_number[killed]
    assert ran_on[killed] == second_id
    assert lost.state == TS.FAIL and "Ray worker ended" in lost.user_attrs["error"], lost.user_attrs
    retries = [t for t in trials if t.user_attrs.get("retry_of") == killed]
    assert len(retries) == 1, output[-3000:]
    retry = retries[0]
    assert retry.state == TS.COMPLETE and ran_on[retry.number] == head_id
    assert retry.params == lost.params and retry.user_attrs["draw"] == lost.user_attrs["draw"]
    assert retry.user_attrs["attempt"] == 1
    # The retry trained the same run from the start: its curve equals what the lost trial had reported.
    shared = sorted(set(lost.intermediate_values) & set(retry.intermediate_values))
    assert shared and all(retry.intermediate_values[s] == pytest.approx(lost.intermediate_values[s], rel=1e-5)
                          for s in shared)
    # Nothing lost, nothing run twice: each draw ends exactly once COMPLETE or PRUNED; the only failure is
    # the lost trial; every trial started after the kill ran on the head node.
    finished = [t.user_attrs["draw"] for t in trials if t.state in (TS.COMPLETE, TS.PRUNED)]
    assert sorted(finished) == list(range(DRAWS)), [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert [t.number for t in trials if t.state == TS.FAIL] == [killed]
    assert len(trials) == DRAWS + 1 and not [t for t in trials if t.state in (TS.RUNNING, TS.WAITING)]
    after = [t.number for t in trials if t.datetime_start >= lost.datetime_complete]
    assert retry.number in after and {ran_on[n] for n in after} == {head_id}
    assert wall < 200, f"the sweep took {wall:.0f} s"
