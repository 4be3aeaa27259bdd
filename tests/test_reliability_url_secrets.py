"""Issue 23 item 1: a secret in a storage URL's query string (``?password=``, ``?sslpassword=``,
``?passfile=``) is masked like a userinfo password, everywhere a URL is printed, stored or handed to Ray.
Real sweep files through the real CLI; the Ray sweep is in tests/test_reliability_driver.py."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from sweep_util import tiny_sweep

from collapse_hpo.hpo import cli
from collapse_hpo.hpo.sweep.config import parse_sweep
from collapse_hpo.hpo.sweep.runner import shippable_sweep
from collapse_hpo.hpo.sweep.urls import SECRET_ENV_PREFIX, has_password, hide_url, mask_text, resolve_url


def _secret() -> str:
    return f"Pw{uuid.uuid4().hex[:12]}"


@pytest.mark.parametrize("form", ["password", "sslpassword", "passfile", "PASSWORD"])
def test_a_secret_query_parameter_is_masked_and_hidden_from_ray(form: str, tmp_path: Path) -> None:
    secret = _secret()
    url = f"postgresql://postgres@127.0.0.1:5432/test?sslmode=disable&{form}={secret}&application_name=x"
    shown = mask_text(url)
    assert secret not in shown and f"{form}=***" in shown and "sslmode=disable" in shown
    assert has_password(url) and not has_password("postgresql://postgres@127.0.0.1:5432/test?sslmode=disable")
    hidden = hide_url(url)  # what Ray is handed: a ${VAR} of this process's environment
    assert hidden.startswith("${" + SECRET_ENV_PREFIX) and resolve_url(hidden, "x") == url
    doc = {"name": "q", "model": {"width": 16, "depth": 1, "heads": 2, "context": 64}, "tpp": 10,
           "fixed": {"batch_tokens": 512, "lr": 0.01}, "trials": 1, "storage": url,
           "pruner": {"reference": {"study": "fam", "storage": url}}}
    shipped = shippable_sweep(parse_sweep(doc, str(tmp_path / "x.yaml")))
    assert secret not in repr(shipped.to_jsonable())
    # Seen once, the secret is masked in any later message, in its plain or percent-encoded form.
    assert mask_text(f"driver said: {secret} / {secret.lower()}") == f"driver said: *** / {secret.lower()}"


def test_secrets_in_messages_of_every_shape_are_masked() -> None:
    s = _secret()
    assert mask_text(f"host=h password={s} dbname=test") == "host=h password=*** dbname=test"  # conninfo
    assert mask_text(f"c({{'password': '{s}', 'host': 'h'}})") == "c({'password': '***', 'host': 'h'})"
    assert mask_text(f"postgresql://u:{s}@h/db?password={s}x") == "postgresql://u:***@h/db?password=***"
    enc = f"{s}%26%40"
    assert mask_text(f"postgresql://u@h/db?password={enc}") == "postgresql://u@h/db?password=***"
    assert mask_text(f"later {s}&@ and {enc}") == "later *** and ***"
    assert mask_text("sqlite:////tmp/r/study.db?timeout=5") == "sqlite:////tmp/r/study.db?timeout=5"


@pytest.mark.parametrize("command", ["run", "report", "resume"])
def test_an_env_url_with_a_query_password_is_masked_on_the_error_path(
        command: str, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = _secret()
    # A server that is not there (port 1): the connection error quotes the URL.
    monkeypatch.setenv("SEC_DB", f"postgresql://postgres@127.0.0.1:1/test?password={secret}&sslpassword={secret}2")
    path = tiny_sweep(tmp_path, "envq", storage="${SEC_DB}")
    code = cli.main([command, str(path)])
    cap = capsys.readouterr()
    assert code == 2 and secret not in cap.err + cap.out, cap.err
    assert "password=***" in cap.err, cap.err
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_a_literal_query_password_in_the_file_is_masked_in_every_message(tmp_path: Path, capsys: Any) -> None:
    secret = _secret()
    path = tiny_sweep(tmp_path, "litq", storage=f"postgresql://postgres@127.0.0.1:1/test?password={secret}")
    for command in (["run", str(path)], ["report", str(path)], ["dashboard", str(path), "--port", "1"],
                    ["dashboard", "--storage", f"postgresql://postgres@127.0.0.1:1/test?password={secret}"]):
        code = cli.main(command)
        cap = capsys.readouterr()
        assert code == 2 and secret not in cap.err + cap.out, (command, cap.err)
    assert yaml.safe_load(path.read_text())["storage"].endswith(secret)  # the file itself is the user's


def test_a_failed_trial_stores_its_error_with_the_secret_masked(tmp_path: Path) -> None:
    import optuna

    from collapse_hpo.hpo.sweep.trial import _record_failure

    secret = _secret()
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask()
    try:
        raise RuntimeError(f"lost postgresql://u@h/db?sslpassword={secret} mid-trial")
    except RuntimeError as err:
        _record_failure(study, trial.number, trial._trial_id, study._storage, err, 128)
    stored = study.trials[0].user_attrs
    assert "sslpassword=***" in stored["error"] and secret not in repr(stored), stored
