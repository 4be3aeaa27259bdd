"""`collapse-hpo forecast --surrogate S.json --params N --tokens D`: a run's loss curve before training."""

from __future__ import annotations

import argparse

from collapse_hpo.hpo.commands._common import check_outputs
from collapse_hpo.hpo.extras import require
from collapse_hpo.hpo.figures import png_bytes, pyplot
from collapse_hpo.predictors import spreadsheet
from collapse_hpo.predictors.atomic import atomic_write_path
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import adamw_tau, check_one_decay

HELP = "forecast a run's final loss (with a 90% interval) and whole loss curve before training"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of `forecast`."""
    parser.add_argument(
        "--surrogate",
        required=True,
        metavar="SURROGATE.json",
        help="a surrogate with a scaling law: `collapse-hpo calibrate` on curves with a params column",
    )
    parser.add_argument("--params", type=float, required=True, metavar="N", help="model size N (parameters)")
    parser.add_argument(
        "--tokens", type=float, required=True, metavar="D", help="training length D (tokens)"
    )
    parser.add_argument(
        "--schedule",
        default="linear",
        help="LR schedule shape: linear (default, decay to zero), cosine, wsd (last 20%% decays), constant",
    )
    parser.add_argument(
        "--tau",
        default=None,
        help="AdamW timescale B/(eta lambda D) as a fraction of training, or 'none' (no weight decay); "
        "or give --lr, --batch-tokens and --weight-decay instead. With none of these: no weight decay (as "
        "--tau none), and a note says so",
    )
    parser.add_argument("--lr", type=float, default=None, help="peak LR of the hidden matrices (no --tau)")
    parser.add_argument("--batch-tokens", type=float, default=None, help="tokens per optimizer step")
    parser.add_argument("--weight-decay", type=float, default=None, help="AdamW weight decay (0: none)")
    parser.add_argument("--csv", default=None, metavar="OUT.csv", help="write the curve and its band as CSV")
    parser.add_argument("--plot", default=None, metavar="OUT.png", help="write a plot of the curve and band")
    parser.add_argument(
        "--json", action="store_true", help="print one JSON object (final_loss, low, high, ...), not text"
    )


def _tau(args: argparse.Namespace) -> float | None:
    """τ from --tau, or from --lr, --batch-tokens, --weight-decay and --tokens; None means no weight decay."""
    import math

    trio = (args.lr, args.batch_tokens, args.weight_decay)
    check_one_decay(args.tau is not None, args.weight_decay is not None, tau="--tau",
                    weight_decay="--weight-decay")
    if args.tau is not None:
        if any(v is not None for v in trio):
            raise InputError("give either --tau or --lr with --batch-tokens and --weight-decay, not both")
        if args.tau.strip().lower() == "none":
            return None
        try:
            tau = float(args.tau)
        except ValueError:
            raise InputError(f"--tau must be a number or 'none', got {args.tau!r}") from None
        if not (math.isfinite(tau) and tau > 0):
            raise InputError(f"--tau must be positive, got {args.tau}")
        return tau
    if all(v is None for v in trio):
        return None
    if any(v is None for v in trio):
        raise InputError("--lr, --batch-tokens and --weight-decay go together (tau = B/(eta lambda D))")
    tau = adamw_tau(args.batch_tokens, args.lr, args.weight_decay, args.tokens)
    return None if math.isinf(tau) else tau


def _tau_omitted(args: argparse.Namespace) -> bool:
    """Neither --tau nor any of --lr, --batch-tokens, --weight-decay was given (τ None: no weight decay)."""
    return all(v is None for v in (args.tau, args.lr, args.batch_tokens, args.weight_decay))


def _no_tau_note(surrogate, source: str) -> str:
    """The note of a forecast whose τ was left out: what was assumed, what it means for this surrogate, and
    how to give τ. InputError when the surrogate cannot forecast a run without weight decay."""
    how = "give the run's tau with --tau, or --lr, --batch-tokens and --weight-decay"
    try:
        b = surrogate.b(None)
    except InputError:
        raise InputError(f"{source}: no --tau given (no weight decay), but this surrogate's b(tau) depends "
                         f"on tau (calibrated with weight decay); {how}") from None
    if surrogate.tau_law == "constant":
        why = ("this surrogate's b(tau) is a constant (calibrated at a single tau or without weight decay), "
               "so any tau it accepts gives the same forecast")
    else:
        why = f"this surrogate serves it with its tau law's limit b = {b:g}"
    return f"no --tau given: forecast for a run without weight decay (as --tau none); {why}; {how}"


def _csv_text(fc) -> str:
    """The forecast as curve CSV text (run, t_hat, loss, lr, tau, tpp) plus the band columns low, high."""
    import io

    out = io.StringIO()
    w = spreadsheet.writer(out, lineterminator="\n")
    w.writerow(["run", "t_hat", "loss", "lr", "tau", "tpp", "low", "high"])
    lr = fc.schedule(fc.t_hat)
    tau = "" if fc.tau is None else repr(float(fc.tau))
    for t, y, e, lo, hi in zip(fc.t_hat, fc.loss, lr, fc.loss_low, fc.loss_high):
        w.writerow(["forecast", *(repr(float(v)) for v in (t, y, e)), tau, repr(float(fc.tpp)),
                    repr(float(lo)), repr(float(hi))])
    return out.getvalue()


def _plot_bytes(fc) -> bytes:
    """A PNG of the forecast curve with its band."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.fill_between(fc.t_hat, fc.loss_low, fc.loss_high, alpha=0.25, label=f"{100 * fc.confidence:g}% band")
    ax.plot(fc.t_hat, fc.loss, label="forecast L(t_hat)")
    ax.set_xlabel("t_hat (fraction of training tokens)")
    ax.set_ylabel("training loss")
    ax.set_title(f"N = {fc.params:.3g} parameters, D = {fc.tokens:.3g} tokens, {fc.schedule.kind}")
    ax.set_ylim(fc.loss_low[-1] * 0.97, float(fc.loss_high[fc.t_hat >= 0.05][0]) * 1.03)
    ax.legend()
    return png_bytes(fig, dpi=100, bbox_inches="tight")


def _write_all(files: dict) -> None:
    """Write every ``path: bytes`` with the atomic writer (mode 0666 less the umask, or the old file's),
    all or nothing: each goes to its temporary file first, and the files replace their targets only once
    every one was written."""
    import contextlib

    with contextlib.ExitStack() as stack:
        for path, data in files.items():
            tmp = stack.enter_context(atomic_write_path(path))
            with open(tmp, "wb") as fh:
                fh.write(data)


def run(args: argparse.Namespace) -> int:
    """Forecast, then print (text or JSON) and write the optional CSV and plot (nothing on bad input)."""
    import json
    from pathlib import Path

    from collapse_hpo.predictors.forecast import forecast  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.predictors.schedules import KINDS, Schedule  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.predictors.surrogate import Surrogate  # deferred: pulls numpy; --help stays fast

    if args.plot is not None:
        require("--plot", "matplotlib")
    check_outputs(args.csv, args.plot, what="forecast output")  # every output, before any work
    kind = args.schedule.strip().lower()
    if kind not in KINDS or kind == "data":
        raise InputError(f"--schedule must be one of linear, cosine, wsd, constant, got {args.schedule!r}")
    tau = _tau(args)
    surrogate = Surrogate.load(args.surrogate)
    # τ left out: say what was assumed (a surrogate without a law is refused for that, by forecast)
    no_tau = _no_tau_note(surrogate, args.surrogate) if _tau_omitted(args) and surrogate.scaling_law else None
    try:
        fc = forecast(surrogate, args.params, args.tokens, schedule=Schedule(kind=kind), tau=tau)
    except InputError as err:
        raise InputError(f"{args.surrogate}: {err}") from None
    if no_tau is not None:
        fc.notes.insert(0, no_tau)
    files = {}
    if args.csv is not None:
        files[Path(args.csv)] = _csv_text(fc).encode()
    if args.plot is not None:
        files[Path(args.plot)] = _plot_bytes(fc)
    _write_all(files)
    if args.json:
        print(json.dumps(fc.summary(), allow_nan=False))
        return 0
    print(
        f"final loss {fc.final_loss:.4f}  (90% interval {fc.low:.4f} .. {fc.high:.4f})  for N = "
        f"{fc.params:.4g} parameters, D = {fc.tokens:.4g} tokens (TPP {fc.tpp:.4g}), "
        f"tau {'none' if fc.tau is None else format(fc.tau, '.4g')}, {fc.schedule.kind} schedule"
    )
    print(f"{'t_hat':>6} {'loss':>8} {'low':>8} {'high':>8}")
    for target in (0.1, 0.2, 0.3, 0.5, 0.75, 1.0):
        i = int(abs(fc.t_hat - target).argmin())
        print(f"{fc.t_hat[i]:>6.2f} {fc.loss[i]:>8.4f} {fc.loss_low[i]:>8.4f} {fc.loss_high[i]:>8.4f}")
    for note in fc.notes:
        print(f"note: {note}")
    for path in files:
        print(f"wrote {path}")
    return 0
