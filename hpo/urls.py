"""Storage URLs: where they come from (a sweep file or the environment) and how they are shown.

A password never leaves the process that was given it:

- `mask_url` / `mask_text` replace the password of every ``scheme://user:password@host`` with ``***``. Every
  message, log line, user attr and file this package writes goes through them.
- A URL may be written ``${NAME}`` in a sweep file: it is read from the environment variable ``NAME`` when
  used (`resolve_url`), so the file, the study's ``sweep_config`` attr and Ray's experiment state hold only
  ``${NAME}``. With no ``storage`` in the file, `STORAGE_ENV` is used when it is set; a ``study`` reference
  with no ``storage`` reads `REFERENCE_STORAGE_ENV`.
- A URL with a literal password handed to Ray workers is replaced by ``${`SECRET_ENV_PREFIX`<n>}`` and the
  URL put into that variable of the driver's environment, which a local Ray's workers inherit (`hide_url`).
"""

from __future__ import annotations

import hashlib
import os
import re

from collapse_hpo.predictors.errors import InputError

#: Environment variable holding the sweep's storage URL when the sweep file gives none.
STORAGE_ENV = "COLLAPSE_HPO_STORAGE"
#: Environment variable holding a ``study`` reference's storage URL when the sweep file gives none.
REFERENCE_STORAGE_ENV = "COLLAPSE_HPO_REFERENCE_STORAGE"
#: Prefix of the variables `hide_url` sets in the driver for its local Ray workers.
SECRET_ENV_PREFIX = "COLLAPSE_HPO_SECRET_"

_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
# scheme://user:password@ ... : the password is everything between the first ':' after '//' and the last
# '@' before the host (passwords may contain '@' or ':').
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^/:@\s]*):(?P<pw>[^\s/]*)@(?=[^@\s/]*(?:[/\s?]|$))")


def env_name(url: str | None) -> str | None:
    """The variable name of a ``${NAME}`` URL, else None."""
    if url is None:
        return None
    m = _ENV_REF.match(url.strip())
    return m.group(1) if m else None


SCHEMES = ("sqlite", "postgresql", "mysql")


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a shared Optuna storage (one line, password masked), or None when it can.

    Refused: another scheme; in-memory SQLite (``sqlite://``, ``sqlite:///:memory:``: Ray workers cannot
    share it); a server URL without a database name (``postgresql://host``: it would write into whatever
    database the server defaults to).
    """
    shown = mask_url(url)
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.split("+", 1)[0] not in SCHEMES:
        return f"storage must be a sqlite:///, postgresql:// or mysql:// URL (with a database), got {shown!r}"
    if scheme.startswith("sqlite"):
        path = rest[1:] if rest.startswith("/") else ""
        path = path.split("?", 1)[0]
        if not path or path == ":memory:" or path.startswith("file::memory:"):
            return (f"{shown!r} is an in-memory SQLite database, which Ray workers cannot share; give a file "
                    "(sqlite:///PATH/study.db)")
        return None
    _host, _, database = rest.rpartition("@")[2].partition("/")
    database = database.split("?", 1)[0]
    if not database:
        return f"{shown!r} names no database; give {scheme}://USER@HOST/DATABASE"
    return None


def resolve_url(url: str, where: str) -> str:
    """The URL itself, or the value of the environment variable of a ``${NAME}`` URL.

    ``where`` names the file and field for the error (InputError) raised when the variable is unset or empty.
    """
    name = env_name(url)
    if name is None:
        return url
    value = os.environ.get(name, "").strip()
    if not value:
        raise InputError(f"{where}: environment variable {name} is not set; export it with the storage URL "
                         "(e.g. postgresql://user:password@host/db)")
    return value


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (user, host and database kept)."""
    return mask_text(url)


def mask_text(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***`` (for messages and stored text)."""
    if "://" not in text or "@" not in text:
        return text
    return _CREDENTIALS.sub(lambda m: f"{m.group('head')}:***@" if m.group("pw") else m.group(0), text)


def has_password(url: str | None) -> bool:
    """True when ``url`` holds a literal password."""
    return url is not None and mask_text(url) != url


def hide_url(url: str) -> str:
    """A form of ``url`` safe to persist: a literal password is moved into an environment variable of this
    process (inherited by the workers of a local Ray) and ``${VAR}`` returned; other URLs as they are."""
    if not has_password(url):
        return url
    name = SECRET_ENV_PREFIX + hashlib.sha256(url.encode()).hexdigest()[:12].upper()
    os.environ[name] = url
    return "${" + name + "}"
