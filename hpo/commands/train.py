"""`collapse-hpo train`: train one run and write its loss curve in the curve CSV format.

The CSV (columns run, t_hat, loss, lr, tau, tpp; predictors/curves.py) feeds `collapse-hpo calibrate` and
`collapse-hpo predict` directly. A progress line is shown on stderr while training.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from collapse_hpo.hpo.commands._common import check_outputs
from collapse_hpo.hpo.extras import require
from collapse_hpo.predictors.atomic import atomic_write
from collapse_hpo.predictors.errors import InputError
from collapse_hpo.predictors.timescale import check_one_decay, optimal_tau

HELP = "train one model (size, TPP, schedule, τ or λ, corpus, device) and write its curve CSV"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--width", type=int, default=64, help="model width d (default 64)")
    g.add_argument("--depth", type=int, default=2, help="number of blocks L (default 2)")
    g.add_argument("--heads", type=int, default=4, help="attention heads, dividing width (default 4)")
    g.add_argument("--base-width", type=int, default=64, help="CompleteP base width (default 64)")
    g.add_argument("--base-depth", type=int, default=2, help="CompleteP base depth (default 2)")
    g.add_argument("--mlp", choices=("squared_relu", "swiglu"), default="squared_relu")
    g.add_argument("--position", choices=("rope", "alibi"), default="rope")
    g.add_argument("--context", type=int, default=128, help="sequence length in tokens (default 128)")
    g.add_argument(
        "--vocab-size", type=int, default=256, help="vocabulary (256 = bytes; token files need more)"
    )
    g = parser.add_argument_group("tokens")
    budget = g.add_mutually_exclusive_group()
    budget.add_argument(
        "--tpp", type=float, default=None, help="tokens per non-embedding parameter (default 20)"
    )
    budget.add_argument("--total-tokens", type=int, default=None, help="training tokens D")
    g.add_argument(
        "--batch-tokens", type=int, default=4096, help="tokens per optimizer step B (default 4096)"
    )
    g.add_argument("--micro-batch-tokens", type=int, default=None, help="tokens per micro-batch (default B)")
    g = parser.add_argument_group("optimizer")
    g.add_argument("--lr", type=float, default=3e-3, help="peak LR of the hidden matrices (default 3e-3)")
    g.add_argument(
        "--tau",
        default=None,
        help="AdamW timescale τ = B/(ηλD); λ is derived. 'opt' = τ_opt(TPP) = 0.785·TPP^-0.5",
    )
    g.add_argument(
        "--weight-decay", type=float, default=None, help="AdamW λ of the hidden matrices (τ reported)"
    )
    g.add_argument(
        "--schedule",
        default="linear",
        help="linear, cosine, wsd, constant, or a JSON schedule dict (default linear)",
    )
    g.add_argument("--warmup", type=float, default=0.1, help="warmup fraction of tokens (default 0.1)")
    g.add_argument("--final", type=float, default=None, help="final LR / peak (default 0)")
    g.add_argument("--decay", type=float, default=None, help="wsd: fraction of training in the final decay")
    g = parser.add_argument_group("run")
    g.add_argument("--corpus", default="stdlib", help="'stdlib', a text file or folder, or a nanoGPT .bin")
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (default cpu)")
    g.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="bfloat16: CUDA autocast"
    )
    g.add_argument("--compile", action="store_true", help="torch.compile the model (CUDA)")
    g.add_argument("--seed", type=int, default=0, help="model init seed (default 0)")
    g.add_argument("--data-seed", type=int, default=0, help="data order seed, independent of --seed")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    g.add_argument("--report-every-tokens", type=int, default=None, help="curve cadence (default D/100)")
    g.add_argument("--checkpoint-dir", default=None, help="write checkpoints here and resume from them")
    g.add_argument("--run", default=None, help="run name in the CSV (default w{width}d{depth}s{seed})")
    g.add_argument("-o", "--output", required=True, help="curve CSV to write (atomically)")
    g.add_argument(
        "--append", action="store_true", help="add the run to an existing CSV (replacing its name)"
    )
    g.add_argument("--metadata", default=None, help="also write the run's metadata as JSON here")
    g.add_argument("--quiet", action="store_true", help="no progress line")
    g = parser.add_argument_group("fault injection (corrupts training on purpose)")
    g.add_argument("--fault-at", type=float, default=None, help="t̂ from which the fault is on")
    g.add_argument(
        "--fault-kind",
        default="loss_normalization",
        choices=("loss_normalization", "exception", "out_of_memory", "nan_loss"),
    )
    g.add_argument("--fault-micro-batch-tokens", type=int, default=None, help="faulty micro-batch size")
    g.add_argument("--fault-strength", type=float, default=1.0)
    g.add_argument("--fault-rows-fraction", type=float, default=0.5)
    g.add_argument("--acknowledge-fault", action="store_true", help="required with --fault-at")


def _schedule(args: argparse.Namespace):
    from collapse_hpo.predictors.schedules import Schedule  # deferred: pulls numpy; --help stays fast

    spec = args.schedule.strip()
    if spec.startswith("{"):
        try:
            d = json.loads(spec)
        except json.JSONDecodeError as err:
            raise InputError(
                f"--schedule: not valid JSON ({err.msg}); give a kind name or a JSON dict"
            ) from None
        return Schedule.parse(d)
    d = {"kind": spec.lower(), "warmup": args.warmup}
    if args.final is not None:
        d["final"] = args.final
    if args.decay is not None:
        d["decay"] = args.decay
    return Schedule.parse(d)


def build_config(args: argparse.Namespace):
    """The TrainConfig of the parsed arguments (InputError on bad or conflicting values)."""
    from collapse_hpo.trainers.config import (  # deferred: pulls numpy; --help stays fast
        FAULT_ACKNOWLEDGEMENT,
        FaultConfig,
        TrainConfig,
        plan,
    )

    check_one_decay(args.tau is not None, args.weight_decay is not None, tau="--tau",
                    weight_decay="--weight-decay")
    fault = None
    if args.fault_at is not None:
        if not args.acknowledge_fault:
            raise InputError(
                "--fault-at: fault injection corrupts training; add --acknowledge-fault to confirm"
            )
        fault = FaultConfig(
            acknowledge=FAULT_ACKNOWLEDGEMENT,
            kind=args.fault_kind,
            start_t_hat=args.fault_at,
            micro_batch_tokens=args.fault_micro_batch_tokens,
            strength=args.fault_strength,
            rows_fraction=args.fault_rows_fraction,
        )
    elif args.acknowledge_fault:
        raise InputError("--acknowledge-fault: no fault given; add --fault-at T_HAT or drop the flag")
    kwargs = dict(
        width=args.width,
        depth=args.depth,
        heads=args.heads,
        base_width=args.base_width,
        base_depth=args.base_depth,
        mlp=args.mlp,
        position=args.position,
        context=args.context,
        vocab_size=args.vocab_size,
        tpp=args.tpp,
        total_tokens=args.total_tokens,
        batch_tokens=args.batch_tokens,
        micro_batch_tokens=args.micro_batch_tokens,
        lr=args.lr,
        weight_decay=args.weight_decay,
        schedule=_schedule(args),
        seed=args.seed,
        device=args.device,
        dtype=args.dtype,
        compile=args.compile,
        threads=args.threads,
        corpus=args.corpus,
        report_every_tokens=args.report_every_tokens,
        checkpoint_dir=args.checkpoint_dir,
        fault=fault,
    )
    tau = None
    if args.tau is not None:
        text = str(args.tau).strip().lower()
        if text != "opt":
            try:
                tau = float(text)
            except ValueError:
                raise InputError(
                    f"--tau: {args.tau!r} is not a number; give a positive number or 'opt'"
                ) from None
    config = TrainConfig(**kwargs)
    if args.tau is not None and tau is None:  # 'opt': τ_opt at the run's actual TPP
        tau = optimal_tau(plan(config).tpp)
    if tau is not None:
        config = TrainConfig(**{**kwargs, "tau": tau})
    return config


class _Progress:
    def __init__(self, total_tokens: int, quiet: bool) -> None:
        self.total, self.quiet, self.t0 = total_tokens, quiet, time.perf_counter()

    def __call__(self, report) -> None:
        if self.quiet:
            return
        dt = time.perf_counter() - self.t0
        speed = report.tokens / dt if dt > 0 else 0.0
        eta = (self.total - report.tokens) / speed if speed > 0 else math.nan
        val = f" val {report.val_loss:.4f}" if report.val_loss is not None else ""
        sys.stderr.write(
            f"\rt_hat {report.t_hat:6.3f}  tokens {report.tokens}/{self.total}  loss "
            f"{report.loss:.4f}{val}  lr {report.lr:.3g}  {speed:,.0f} tok/s  eta {eta:5.0f} s "
        )
        sys.stderr.flush()


def run(args: argparse.Namespace) -> int:
    require("training", "torch")
    from collapse_hpo.predictors.curves import (  # deferred: pulls numpy; --help stays fast
        read_curves_csv,
        write_curves_csv,
    )
    from collapse_hpo.trainers.config import plan  # deferred: pulls numpy; --help stays fast
    from collapse_hpo.trainers.train import train  # deferred: pulls torch (train extra)

    out = Path(args.output)
    if not out.parent.exists() and str(out.parent):
        raise InputError(f"-o {out}: folder {out.parent} does not exist; create it first")
    check_outputs(args.output, what="curve")
    check_outputs(args.metadata, what="metadata")
    config = build_config(args)
    existing = read_curves_csv(out) if args.append and out.exists() else []
    p = plan(config)
    name = args.run or f"w{config.width}d{config.depth}s{config.seed}"
    tau_text = "none" if p.tau is None else f"{p.tau:.4g}"
    if not args.quiet:
        print(
            f"collapse-hpo train: {name}: N {p.params_non_embedding} non-embedding ({p.params_total} total), "
            f"D {p.total_tokens} tokens (TPP {p.tpp:.2f}), {p.steps} steps of {config.batch_tokens}, "
            f"lr {config.lr:g}, weight_decay {p.weight_decay:.4g}, tau {tau_text}",
            file=sys.stderr,
        )
    result = train(config, reporter=_Progress(p.total_tokens, args.quiet))
    if not args.quiet:
        sys.stderr.write("\n")
    for w in result.metadata["warnings"]:
        print(f"collapse-hpo train: warning: {w}", file=sys.stderr)
    curves = [c for c in existing if c.run != name] + [result.to_curve(name)]
    write_curves_csv(out, curves)
    if args.metadata:
        with atomic_write(args.metadata) as fh:
            json.dump({"run": name, **result.metadata}, fh, indent=2, default=str)
    val = result.final_val_loss
    print(
        f"{name}: final_loss {result.final_loss:.4f}"
        + (f", val_loss {val:.4f}" if val is not None else "")
        + f", {result.metadata['train_seconds']:.1f} s; curve written to {out}"
    )
    return 0
