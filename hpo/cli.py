"""The `collapse-hpo` command line.

Each sub-command lives in its own module under ``collapse_hpo.hpo.commands`` and exposes ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``. Modules keep heavy imports (torch, ray, optuna) inside
``run`` so that ``collapse-hpo --help`` and the predictor commands start fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util  # `import importlib` alone does not load the util submodule
import sys

from collapse_hpo.hpo.sweep import storage_errors
from collapse_hpo.hpo.sweep.stop import STOP
from collapse_hpo.hpo.sweep.urls import mask_text
from collapse_hpo.predictors.atomic import describe_os_error
from collapse_hpo.predictors.errors import InputError, clip

# Sub-command name -> module. The order here is the order in `--help`.
COMMANDS: dict[str, str] = {}


def _register() -> None:
    names = [
        "run", "resume", "report", "dashboard",
        "calibrate", "predict", "forecast", "train", "replay", "monitor",
    ]
    for name in names:
        module = f"collapse_hpo.hpo.commands.{name}"
        if importlib.util.find_spec(module) is not None:
            COMMANDS[name] = module


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every available sub-command."""
    _register()
    parser = argparse.ArgumentParser(
        prog="collapse-hpo",
        description="Hyperparameter sweeps for LLM training with collapse-based early stopping.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        # argparse %-formats a sub-command's `help` (not its description): "90%" must reach it as "90%%"
        p = sub.add_parser(name, help=module.HELP.replace("%", "%%"), description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script. Bad input, and a file system that refuses a file, give one line on
    stderr (passwords masked) and exit status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2

    def fail(message: str) -> int:
        line = clip(" ".join(mask_text(message).split()))  # one line, never a password, never megabytes
        print(f"collapse-hpo {args.command}: error: {line}", file=sys.stderr)
        return 2

    try:
        storage_errors.watch()  # a damaged database or a full disk: one line naming the file (StorageFault)
        return int(args._run(args) or 0)
    except InputError as err:
        return fail(str(err))
    except OSError as err:  # a folder or file the command cannot use: read-only, full, /sys, a folder
        where = err.filename if err.filename is not None else "a file"
        return fail(describe_os_error(where, err, "use"))
    except RecursionError:
        return fail("an input file is nested too deeply to be read (e.g. a JSON file thousands of levels "
                    "deep); check the files given")
    except OverflowError as err:
        return fail(f"a number in the input is too large ({err}); check the values given")
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM / SIGHUP in a sweep's driver (hpo/sweep/stop.py)
        stopped = STOP.interrupted(err)
        print(f"collapse-hpo {args.command}: {stopped.message}", file=sys.stderr)
        return 128 + int(stopped.signum)


if __name__ == "__main__":
    sys.exit(main())
