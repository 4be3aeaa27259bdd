"""The package as a user installs it: the built wheel, core only, in a fresh virtual environment.

One module-scoped install (``installed``): the wheel is built from a copy of the package's files, installed
without its extras (no torch, ray, matplotlib, optuna-dashboard) into a new venv, and every check runs that
venv's ``collapse-hpo`` or ``python`` from a temporary folder, so neither the repository nor the dev venv is
on ``sys.path``. The venv is made without pip and filled by the dev venv's pip (``--python``) with byte-code
compilation off: about 20 s instead of a minute, and nothing borrowed from the dev venv (a missing core
dependency fails the import, as it would for a user). The wheel is built in pip's isolated build
environment, as ``pip install`` builds it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from readme_util import readme_block

REPO = Path(__file__).resolve().parents[1]
#: What the wheel is built from (a copy, so the build writes nothing into the repository).
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "collapse_hpo", "hpo", "predictors", "trainers",
           "kernels")
#: Modules of the extras: none may be installed by the core, nor imported by the core's paths.
HEAVY = ("torch", "triton", "ray", "matplotlib", "plotly", "optuna_dashboard", "psycopg", "psycopg2")
WHEELS = Path("/opt/wheels")  # a local wheel folder, used as the Makefile uses it when it exists


def _env() -> dict[str, str]:
    """The environment of a user's shell: no PYTHONPATH, no dev venv first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(REPO)))
    return env


def _run(args: list[str], cwd: Path, timeout: float = 120,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run in the user's environment (plus ``env``)."""
    return subprocess.run(args, cwd=cwd, env={**_env(), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin folder, a folder outside the repository): the core wheel installed in a fresh venv."""
    base = tmp_path_factory.mktemp("install")
    src, dist, venv, work = base / "src", base / "dist", base / "venv", base / "work"
    src.mkdir()
    work.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    links = ["--find-links", str(WHEELS)] if WHEELS.is_dir() else []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    built = _run([*pip, "wheel", "--no-deps", "-q", "-w", str(dist), str(src)], cwd=work, timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = dist.glob("collapse_hpo-*.whl")
    import zipfile

    inside = set(zipfile.ZipFile(wheel).namelist())
    # the folders as installed: collapse_hpo/ is the namespace itself, the others are mapped under it
    sources = {("" if name == "collapse_hpo" else "collapse_hpo/") + p.relative_to(REPO).as_posix()
               for name in SOURCES if (REPO / name).is_dir()
               for pattern in ("*.py", "*.json") for p in (REPO / name).rglob(pattern)}
    # every module and data file of the repository is in the wheel (a new sub-package must be listed in
    # pyproject.toml's packages, a data file in its package-data: the online reference's builtin prior)
    assert sources <= inside, f"not in the wheel: {sorted(sources - inside)[:10]}"
    assert any(n.endswith("/licenses/LICENSE") for n in inside)  # the license file travels with it
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=work)
    assert made.returncode == 0, made.stderr[-3000:]
    python = venv / "bin" / "python"
    done = _run([*pip, "--python", str(python), "install", "-q", "--no-compile", *links, str(wheel)],
                cwd=work, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv / "bin", work


def test_the_core_install_has_no_extra_and_no_repository_on_its_path(installed):
    bin_dir, work = installed
    probe = ("import importlib.util, json, collapse_hpo.hpo.optuna_side.pruner as p; "
             "from collapse_hpo.predictors.prior import BUILTIN, load_prior; "
             "load_prior(BUILTIN)  # the online reference's prior: a data file of the wheel\n"
             f"print(json.dumps([p.__file__, [m for m in {HEAVY!r} if importlib.util.find_spec(m)]]))")
    out = _run([str(bin_dir / "python"), "-c", probe], cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    where, extras = json.loads(out.stdout)
    assert extras == [], f"the core install pulled in {extras}"
    assert Path(where).is_relative_to(bin_dir.parent), f"the pruner came from {where}, not the wheel"
    assert not Path(where).is_relative_to(REPO)


def test_installed_cli_help_and_every_subcommand_help(installed):
    bin_dir, work = installed
    cli = str(bin_dir / "collapse-hpo")
    top = _run([cli, "--help"], cwd=work)
    assert top.returncode == 0 and top.stderr == "", top.stderr[-3000:]
    assert "forecast a run's final loss (with a 90% interval)" in " ".join(top.stdout.split())
    listed = _run([str(bin_dir / "python"), "-c", "from collapse_hpo.hpo import cli; cli.build_parser(); "
                   "print(' '.join(cli.COMMANDS))"], cwd=work)
    names = listed.stdout.split()
    # every command module of the repository is in the wheel and registered
    assert names and set(names) == {p.stem for p in (REPO / "hpo" / "commands").glob("[a-z]*.py")}, names
    for name in names:
        sub = _run([cli, name, "--help"], cwd=work)
        assert sub.returncode == 0 and sub.stderr == "", f"{name} --help: {sub.stderr[-2000:]}"
        assert sub.stdout.startswith(f"usage: collapse-hpo {name}"), sub.stdout[:200]
    bare = _run([cli], cwd=work)  # no command: the usage and exit 2, never a traceback
    assert bare.returncode == 2 and "Traceback" not in bare.stdout + bare.stderr
    assert "usage: collapse-hpo" in bare.stdout


def test_readme_plain_optuna_example_runs_on_the_core_install(installed):
    """The README's example, as written, prunes with only the core installed (no torch, ray, matplotlib): a
    seeded random search over lr, λ and warm-up whose trials each give the pruner their own controls."""
    bin_dir, work = installed
    folder = work / "readme"
    folder.mkdir()
    (folder / "example.py").write_text(readme_block("## In a plain Optuna objective"), encoding="utf-8")
    # 20 small trainings in numpy; one BLAS thread, as on a shared CI machine OpenBLAS's threads spin
    # against the other jobs (20x slower at a load of 20 on 2 cores)
    out = _run([str(bin_dir / "python"), "example.py"], cwd=folder, timeout=300,
               env={"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"best \{.*\}, loss [0-9.]+; (\d+) of 20 trials pruned, (\d+)% of the optimizer steps",
                  out.stdout)
    assert m, out.stdout
    assert int(m.group(1)) >= 1 and int(m.group(2)) < 100  # pruned something, saved steps
    assert (folder / "sweep.db").is_file()
    import optuna

    trials = optuna.load_study(study_name="char-mlp", storage=f"sqlite:///{folder / 'sweep.db'}").trials
    assert len(trials) == 20
    for trial in trials:  # each trial's own controls reached the pruner: its warm-up and τ = 1/(η·λ·steps)
        params, attrs = trial.params, trial.user_attrs
        assert attrs["units"] == "steps" and attrs["schedule"]["kind"] == "cosine"
        assert attrs["schedule"]["warmup"] == pytest.approx(params["warmup"])
        assert attrs["tau"] == pytest.approx(1.0 / (params["lr"] * params["weight_decay"] * attrs["total"]))
        if trial.state == optuna.trial.TrialState.PRUNED:  # every decision carries a prediction
            assert attrs["predicted_final_loss"] > 0
    # its review on the core: the table and CSV files; the figure names the extra that draws it
    report = _run([str(bin_dir / "collapse-hpo"), "report", "--storage", "sqlite:///sweep.db", "--study",
                   "char-mlp"], cwd=folder)
    assert report.returncode == 0, report.stderr[-3000:]
    assert "pip install 'collapse-hpo[dashboard]'" in report.stdout
    assert {p.name for p in (folder / "results" / "char-mlp").iterdir()} == {"results.csv", "curves.csv"}


def test_core_commands_work_and_extra_commands_name_their_extra(installed):
    """calibrate, predict, forecast and replay of Optuna's pruners run on the core; a command that needs an
    extra says which in one line, exit 2, and writes nothing."""
    bin_dir, work = installed
    cli, python = str(bin_dir / "collapse-hpo"), str(bin_dir / "python")
    folder = work / "commands"
    folder.mkdir()
    make = ("from collapse_hpo.predictors.curves import write_curves_csv\n"
            "from collapse_hpo.predictors.synthetic import synthetic_curves\n"
            "write_curves_csv('curves.csv', synthetic_curves(taus=(0.1, 0.2), tpps=(20.0, 80.0), seed=0))\n")
    assert _run([python, "-c", make], cwd=folder).returncode == 0
    for args in (["calibrate", "curves.csv", "-o", "surrogate.json", "--folds", "2"],
                 ["predict", "curves.csv", "--surrogate", "surrogate.json", "--fraction", "0.2"],
                 ["replay", "curves.csv", "--orders", "1", "--pruner", "median", "--pruner", "collapse",
                  "--pruner", "asha", "--surrogate", "surrogate.json", "--jobs", "1"]):
        out = _run([cli, *args], cwd=folder)
        assert out.returncode == 0, f"{args[0]}: {out.stderr[-2000:]}"
    assert "asha skipped" in out.stderr and "pip install 'collapse-hpo[ray]'" in out.stderr  # Ray's peer
    assert re.search(r"^median\s", out.stdout, re.M) and re.search(r"^collapse\s", out.stdout, re.M)
    law_free = _run([cli, "forecast", "--surrogate", "surrogate.json", "--params", "5e8", "--tokens", "2e10",
                     "--tau", "0.1"], cwd=folder)  # runs, and says that this surrogate has no scaling law
    assert law_free.returncode == 2 and "no scaling law" in law_free.stderr
    assert "Traceback" not in law_free.stderr
    before = sorted(p.name for p in folder.iterdir())
    for args, extra in ((["run", "sweep.yaml"], "collapse-hpo[ray,train]"),
                        (["train", "--tpp", "1", "-o", "run.csv"], "collapse-hpo[train]"),
                        (["dashboard", "--storage", "sqlite:///x.db"], "collapse-hpo[dashboard]"),
                        (["forecast", "--surrogate", "surrogate.json", "--params", "5e8", "--tokens", "2e10",
                          "--plot", "f.png"], "collapse-hpo[dashboard]"),
                        (["replay", "curves.csv", "--plot", "p.png"], "collapse-hpo[dashboard]"),
                        (["report", "--storage", "postgresql://postgres@127.0.0.1:5432/test"],
                         "collapse-hpo[postgres]")):
        out = _run([cli, *args], cwd=folder)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1, f"{args[0]}: {out.stderr[-2000:]}"
        assert f"pip install '{extra}'" in lines[0], lines[0]
    assert sorted(p.name for p in folder.iterdir()) == before


def test_core_import_paths_load_no_heavy_module():
    """In the dev venv, where every extra is installed: the pruner and the CLI's help import none of them."""
    probe = ("import sys; import collapse_hpo.hpo.optuna_side.pruner; "
             "from collapse_hpo.hpo.cli import build_parser; "
             "build_parser().format_help(); "
             "from collapse_hpo import CollapsePruner, set_trial_controls, calibrate, forecast; "
             f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def test_public_face_on_the_core_install(installed):
    """``from collapse_hpo import ...`` on the core install: the pruner and the predictors load; the Ray
    scheduler says which extra it needs (no traceback from inside Ray's absence)."""
    bin_dir, work = installed
    probe = ("import collapse_hpo; from collapse_hpo import CollapsePruner, set_trial_controls, calibrate, "
             "forecast, PruneSettings; CollapsePruner(reference='online')\n"
             "try:\n    from collapse_hpo import CollapseScheduler\nexcept ImportError as err:\n"
             "    print(err)")
    out = _run([str(bin_dir / "python"), "-c", probe], cwd=work)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "pip install 'collapse-hpo[ray]'" in out.stdout, out.stdout
