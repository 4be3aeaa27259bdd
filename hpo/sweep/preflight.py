"""Everything a sweep needs, checked before a single file, folder, table or study is created.

`preflight` is the one gate of `run` and `resume` (`check_for_report` of `report`): each check raises
`InputError` with one line naming the sweep file, the field and what to do, and none of them writes anything
(a storage is connected to, never initialised; a folder is probed only where it already exists).

What is checked, in order:

1. every trial's config at the corners of the search space (model shape, token budget, schedule, the trainer's
   own checks), ``batch_tokens`` not above the training tokens, and each trial's estimated peak memory
   against the node's memory (`estimate_trial_bytes`);
2. the corpus exists and the training device is available (local Ray only: a remote cluster's workers have
   their own);
3. the trials fit the Ray cluster (local Ray: from the file);
4. the pruner's reference: a surrogate file loads; a ``study`` reference's storage answers (connect timeout
   `CONNECT_TIMEOUT_S`) and holds that study;
5. the results folder can be created and written (not read-only, full, /sys, or a file);
6. the sweep's storage: a SQLite path is a SQLite file or can be created (not a folder or another file); a
   server answers within `CONNECT_TIMEOUT_S` and has the database.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
from pathlib import Path
from typing import Any

from collapse_hpo.hpo.outputs.report import check_report_outputs
from collapse_hpo.hpo.rule.reference import make_reference
from collapse_hpo.hpo.sweep.config import SweepConfig
from collapse_hpo.hpo.sweep.space import space_for_sweep
from collapse_hpo.hpo.sweep.storage_errors import DAMAGED_ADVICE, StorageFault, classify
from collapse_hpo.hpo.sweep.trial import storage_url, train_config
from collapse_hpo.hpo.sweep.urls import (
    STORAGE_ENV,
    has_password,
    mask_text,
    mask_url,
    resolve_url,
    sqlite_file,
    url_problem,
)
from collapse_hpo.predictors.atomic import check_writable_dir
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.trainers.config import mlp_hidden, plan

#: Seconds a storage server may take to accept a connection and answer (stated in the error).
CONNECT_TIMEOUT_S = 10
_SQLITE_MAGIC = b"SQLite format 3\x00"


def field_error(sweep: SweepConfig, field: str, message: str) -> InputError:
    """An InputError ``<sweep file>: field '<field>': <message>`` with any password masked."""
    return InputError(mask_text(f"{sweep.source or '<sweep>'}: field '{field}': {message}"))


def preflight(sweep: SweepConfig, results: Path, storage_url: str, prune: bool) -> None:
    """Run every check of the module docstring for a `run` or `resume` of ``sweep``; InputError on the first
    that fails. ``storage_url`` is the sweep's (possibly ``${NAME}``) URL; ``results`` its results folder."""
    check_secrets(sweep)
    check_trials(sweep)
    check_corpus_and_device(sweep)
    check_local_resources(sweep)
    check_reference(sweep, prune)
    check_results_dir(sweep, results)
    check_storage(sweep, storage_url, results)


def check_for_report(sweep: SweepConfig, results: Path, storage_url: str) -> None:
    """The checks of `report` (it trains nothing): the results folder is writable and the storage answers."""
    check_results_dir(sweep, results)
    check_storage(sweep, storage_url, results)


def check_secrets(sweep: SweepConfig) -> None:
    """A password written in the sweep file can reach a local Ray's workers only through this process's
    environment (`collapse_hpo.hpo.sweep.urls.hide_url`); a remote cluster would need it on disk: refused."""
    if not sweep.executor.address:
        return
    urls = (("storage", sweep.storage), ("pruner.reference.storage", sweep.pruner.reference.storage))
    for field, url in urls:
        if has_password(url):
            raise field_error(sweep, field, "holds a password, which a remote Ray cluster cannot get without "
                              "it being written to disk; write ${NAME} and set NAME on every node (e.g. "
                              f"{STORAGE_ENV})")


# ---------------------------------------------------------------------------------------------- trials
def corners(sweep: SweepConfig) -> list[dict[str, Any]]:
    """Parameter sets at the bounds of each distribution (every combination of low/high or choices, at most
    64 of them)."""
    axes: list[list[tuple[str, Any]]] = []
    for name, d in sweep.space.items():
        if d.type == "categorical":
            values: list[Any] = list(d.choices or [])
        elif d.type == "int":
            values = [int(d.low or 0), int(d.high or 0)]
        else:
            values = [float(d.low or 0.0), float(d.high or 0.0)]
        axes.append([(name, v) for v in values])
    combos = list(itertools.islice(itertools.product(*axes), 64))
    return [dict(c) for c in combos] or [{}]


def check_trials(sweep: SweepConfig) -> None:
    """Each corner trial builds a valid `TrainConfig`, trains at least one full batch, and fits in memory."""
    where = sweep.source or "<sweep>"
    try:
        space_for_sweep(sweep)
    except (InputError, OverflowError, ValueError) as err:
        raise InputError(f"{where}: field 'model': {err}") from None
    memory = node_memory_bytes(sweep)
    for params in corners(sweep):
        names = ", ".join(f"{k}={v}" for k, v in params.items()) or "the fixed values"
        try:
            config, _derived = train_config(sweep, params, sweep.seeds[0])
            p = plan(config)
        except (InputError, OverflowError, ValueError) as err:
            raise InputError(f"{where}: the trial with {names} is invalid: {err}") from None
        if config.batch_tokens > p.requested_total_tokens:
            field = "space.batch_tokens" if "batch_tokens" in sweep.space else "fixed.batch_tokens"
            raise field_error(sweep, field, f"{config.batch_tokens} tokens per step is more than the "
                              f"{p.requested_total_tokens:.0f} training tokens of the trial with {names}; "
                              "lower batch_tokens or raise tpp/total_tokens")
        need = estimate_trial_bytes(config, p.params_total)
        if memory is not None and need > memory:
            raise field_error(sweep, "train.micro_batch_tokens",
                              f"a trial with {names} needs about {need / 2**30:.1f} GiB "
                              f"({p.params_total} parameters, {p.micro_batch_tokens} tokens per micro-batch) "
                              f"but {_memory_name(sweep)} has {memory / 2**30:.1f} GiB; lower "
                              "train.micro_batch_tokens or the model size")


#: Memory of a trial's process before it trains (Python, torch, the corpus), in bytes.
RUNTIME_BYTES = 0.5 * 2**30
#: Elements of one chunk of logits in the fused cross-entropy (`kernels.cross_entropy`: 128 MiB in fp32).
LOGIT_CHUNK = 32 * 2**20


def estimate_trial_bytes(config: Any, params_total: int) -> float:
    """Estimated peak memory of one trial in bytes: the process itself (`RUNTIME_BYTES`), weights,
    gradients and both AdamW moments (16 bytes per parameter in float32), the activations kept for backward
    for one micro-batch (per token and layer 12·width + 3·hidden values: attention runs fused, so its
    scores are not kept), and one chunk of logits with its softmax and gradient (3 · min(tokens · vocab,
    `LOGIT_CHUNK`) floats). Half-precision dtypes halve the activations.

    Measured on CPU (width 16, depth 1, float32): 1.19 GiB peak RSS at 262,144 tokens per micro-batch
    (estimate 1.26) and 2.39 GiB at 1,048,576 (estimate 2.38). Used only to refuse trials that cannot fit.
    """
    micro = float(config.micro_batch_tokens or config.batch_tokens)
    width, depth = int(config.width), int(config.depth)
    hidden = mlp_hidden(width, config.mlp, config.mlp_ratio)
    act_bytes = 2.0 if str(config.dtype) in ("bfloat16", "float16", "bf16", "fp16") else 4.0
    activations = micro * depth * (12 * width + 3 * hidden) * act_bytes
    logits = 3 * min(micro * int(config.vocab_size), LOGIT_CHUNK) * 4.0
    return RUNTIME_BYTES + 16.0 * params_total + activations + logits


def _memory_name(sweep: SweepConfig) -> str:
    return "the GPU" if sweep.train.device.startswith("cuda") else "this node"


def node_memory_bytes(sweep: SweepConfig) -> float | None:
    """Memory one trial may use: the node's RAM (the smaller of physical memory and the cgroup limit) for CPU
    training, or the GPU's memory times ``resources.gpu`` for CUDA; None when unknown or the cluster is
    remote (its nodes are not this one)."""
    if sweep.executor.address:
        return None
    if sweep.train.device.startswith("cuda"):
        try:
            import torch

            if not torch.cuda.is_available():
                return None
            total = float(torch.cuda.get_device_properties(0).total_memory)
            return total * min(1.0, sweep.resources.gpu or 1.0)
        except Exception:
            return None
    values = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        values.append(float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")))
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            values.append(float(text))
    return min(values) if values else None


# ------------------------------------------------------------------------------------------ corpus, device
def check_corpus_and_device(sweep: SweepConfig) -> None:
    """The corpus path exists and the device is usable by a trial (local Ray: this machine is the node)."""
    t = sweep.train
    if t.corpus != "stdlib":
        p = Path(os.path.expanduser(t.corpus))
        p = p if p.is_absolute() else sweep.base_dir() / p
        if not p.exists() and not sweep.executor.address:
            raise field_error(sweep, "train.corpus", f"{p} does not exist; give 'stdlib', a text file or "
                              "folder, or a folder with train.bin/val.bin")
    device = t.device
    if device.startswith("cuda"):
        if sweep.resources.gpu <= 0:
            raise field_error(sweep, "resources.gpu", f"train.device is {device!r} but a trial asks for no "
                              "GPU (Ray hides GPUs from it); set resources.gpu (e.g. 1)")
        if not sweep.executor.address:
            import torch

            if not torch.cuda.is_available():
                raise field_error(sweep, "train.device", f"{device!r}, but this machine has no usable CUDA "
                                  "device; use device: cpu, or run on a GPU node")
            index = int(device.split(":", 1)[1]) if ":" in device else 0
            if index >= torch.cuda.device_count():
                raise field_error(sweep, "train.device", f"{device!r}, but this machine has "
                                  f"{torch.cuda.device_count()} CUDA device(s)")
    elif device == "mps" and not sweep.executor.address:
        import torch

        if not torch.backends.mps.is_available():
            raise field_error(sweep, "train.device", "'mps' is not available on this machine; use cpu")
    elif device not in ("cpu", "mps") and not device.startswith("cuda"):
        raise field_error(sweep, "train.device", f"{device!r} is not a device; use cpu, cuda, cuda:N or mps")


# ---------------------------------------------------------------------------------------------- resources
def slots(sweep: SweepConfig, cpus: float, gpus: float) -> int:
    """Trials that fit at once on ``cpus`` CPU and ``gpus`` GPU; InputError when not even one fits."""
    n = int(cpus // sweep.resources.cpu) if sweep.resources.cpu > 0 else 1
    if sweep.resources.gpu > 0 and math.isfinite(gpus):
        n = min(n, int(gpus // sweep.resources.gpu))
    if n < 1:
        raise InputError(f"{sweep.source}: field 'resources': a trial needs {sweep.resources.cpu} CPU and "
                         f"{sweep.resources.gpu} GPU but the Ray cluster has {float(cpus)} CPU and "
                         f"{float(gpus)} GPU; lower the resources per trial")
    return max(1, n)


def check_local_resources(sweep: SweepConfig) -> None:
    """For a local Ray (no executor address) the cluster's size is known from the file: check that a trial
    fits. A remote cluster is checked once connected (`collapse_hpo.hpo.sweep.runner`)."""
    ex = sweep.executor
    if not ex.address:
        gpus = math.inf if ex.num_gpus is None else float(ex.num_gpus)
        slots(sweep, float(ex.num_cpus or os.cpu_count() or 1), gpus)


# ---------------------------------------------------------------------------------------------- reference
def check_reference(sweep: SweepConfig, prune: bool) -> None:
    """The pruner's reference can be used: a surrogate file (or an online reference's prior) loads; a study
    reference's storage answers and holds the study. Nothing is checked when pruning is off. The pruner's
    settings were checked when the sweep file was read (`PrunerSpec`), so no pruner is built here."""
    if not (prune and sweep.pruner.enabled):
        return
    ref = sweep.pruner.reference
    if ref.kind == "study":
        field = "pruner.reference.storage"
        url = resolve_url(ref.storage_ref or "", f"{sweep.source}: field '{field}'")
        problem = url_problem(url)
        if problem:
            raise field_error(sweep, field, problem)
        if url.startswith("sqlite"):
            path = sqlite_file(url) or Path()
            if not path.is_file():
                raise field_error(sweep, field, f"{path} does not exist; give the storage of the reference "
                                  "study")
            _check_sqlite_file(sweep, field, path)
        names = _study_names(sweep, field, url)
        if ref.study not in names:
            shown = ", ".join(sorted(names)[:5]) or "none"
            raise field_error(sweep, "pruner.reference.study", f"no study {ref.study!r} in "
                              f"{mask_url(url)} (studies there: {shown}); give an existing study")
    try:
        make_reference(ref.spec(sweep.base_dir()))
    except InputError as err:
        raise InputError(mask_text(f"{sweep.source}: field 'pruner.reference': {err}")) from None


def _study_names(sweep: SweepConfig, field: str, url: str) -> set[str]:
    """The Optuna study names in the storage at ``url`` (read with plain SQL: nothing is created)."""
    import sqlalchemy

    engine = _engine(url)
    try:
        with engine.connect() as conn:
            if not sqlalchemy.inspect(conn).has_table("studies"):
                return set()
            rows = conn.execute(sqlalchemy.text("SELECT study_name FROM studies")).fetchall()
            return {str(r[0]) for r in rows}
    except StorageFault:
        raise
    except Exception as err:
        raise field_error(sweep, field, _connect_failure(url, err)) from None
    finally:
        engine.dispose()


# ---------------------------------------------------------------------------------------------- results
def check_results_dir(sweep: SweepConfig, results: Path) -> None:
    """The results folder exists and is writable, or its nearest existing ancestor is a writable folder
    (where it will be created); the report files in it are regular files or new (not a device, a FIFO).
    Creates nothing that stays."""
    where = f"{sweep.source}: results folder {results}"
    probe = results
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{where}: {probe} is a file, not a folder; choose another results folder "
                         "(--results DIR)")
    try:
        check_writable_dir(probe, "results")
    except InputError as err:
        raise InputError(f"{sweep.source}: {err}; choose another results folder (--results DIR)") from None
    if results.is_dir():  # the report's files, written at the end: refused now, not after the sweep
        try:
            check_report_outputs(results)
        except InputError as err:
            raise InputError(f"{sweep.source}: {err}") from None


# ---------------------------------------------------------------------------------------------- storage
def _check_sqlite_file(sweep: SweepConfig, field: str, path: Path) -> None:
    if path.is_dir():
        raise field_error(sweep, field, f"{path} is a folder; give a file name (sqlite:///{path}/study.db)")
    try:
        with path.open("rb") as fh:
            head = fh.read(16)
    except OSError as err:
        raise field_error(sweep, field, f"cannot read {path} ({err.strerror}); check the path") from None
    if head and head != _SQLITE_MAGIC:
        raise field_error(sweep, field, f"{path} exists and is not a SQLite database; give another file name")
    if head:
        check_sqlite_integrity(path)


def check_sqlite_integrity(path: Path) -> None:
    """Raise a `StorageFault` ("damaged database") when SQLite's ``quick_check`` finds the file damaged
    (truncated, a page of garbage), before anything reads or writes it. Read only; it reads every page once
    (milliseconds for a sweep's study.db)."""
    import sqlite3

    try:
        from urllib.parse import quote

        # A URI: '?' or '#' in the path would start its query (and open, or create, another file).
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, timeout=CONNECT_TIMEOUT_S)
    except sqlite3.Error:
        return  # unreadable here (e.g. permissions): the storage's own errors say why later
    try:
        rows = conn.execute("PRAGMA quick_check(1)").fetchall()
    except sqlite3.DatabaseError as err:
        fault = classify(err, str(path))
        if fault is not None:
            raise fault from None
        return  # locked, busy: not a damage
    finally:
        conn.close()
    verdict = str(rows[0][0]) if rows else "no answer"
    if verdict != "ok":
        raise StorageFault(f"{path}: damaged database ({verdict[:200]}): {DAMAGED_ADVICE}", "damaged")


def _engine(url: str) -> Any:
    import sqlalchemy

    url = storage_url(url)
    kwargs: dict[str, Any] = {}
    if url.startswith(("postgresql", "mysql")):
        kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT_S}
    elif url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": CONNECT_TIMEOUT_S}
    return sqlalchemy.create_engine(url, **kwargs)


def _connect_failure(url: str, err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [type(err).__name__])[0]
    return (f"cannot connect to {mask_url(url)} within {CONNECT_TIMEOUT_S} s ({mask_text(first)[:200]}); "
            "check the URL and that the server is running")


def check_storage(sweep: SweepConfig, url: str, results: Path | None = None) -> None:
    """Raise InputError (field ``storage``) when the storage cannot hold the sweep. Creates nothing.

    A ``${NAME}`` URL is read from the environment. SQLite: the path is a SQLite file or does not exist yet,
    in an existing folder (the default one, ``results``, is created later). A server: it answers within
    `CONNECT_TIMEOUT_S` seconds."""
    field = "storage"
    url = resolve_url(url, f"{sweep.source}: field '{field}'")
    problem = url_problem(url)
    if problem:
        raise field_error(sweep, field, problem)
    if url.startswith("sqlite"):
        path = sqlite_file(url) or Path()
        if path.exists():
            _check_sqlite_file(sweep, field, path)
            return
        parent = path.parent
        if parent != results and not parent.is_dir():
            raise field_error(sweep, field, f"folder {parent} of the SQLite file does not exist")
        if parent != results:
            try:
                check_writable_dir(parent, "SQLite storage")
            except InputError as err:
                raise field_error(sweep, field, str(err)) from None
        return
    engine = None
    try:
        engine = _engine(url)
        with engine.connect():
            pass
    except Exception as err:
        raise field_error(sweep, field, _connect_failure(url, err)) from None
    finally:
        if engine is not None:
            engine.dispose()
