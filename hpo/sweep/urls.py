"""Storage URLs: where they come from (a sweep file or the environment) and how they are shown.

A password never leaves the process that was given it:

- `mask_url` / `mask_text` replace every secret a URL can hold with ``***``: the password of
  ``scheme://user:password@host`` and the value of every query parameter whose name holds ``pass``, ``pwd``,
  ``secret`` or ``token`` (``?password=``, ``?sslpassword=``, ``?passfile=``: the file's name, never read
  here). Every message, log line, user attr and file this package writes goes through them. A secret once
  seen in a URL is remembered for the life of the process and masked wherever it appears later (a driver's
  error message that quotes it in another form, e.g. percent-decoded).
- A URL may be written ``${NAME}`` in a sweep file: it is read from the environment variable ``NAME`` when
  used (`resolve_url`), so the file, the study's ``sweep_config`` attr and Ray's experiment state hold only
  ``${NAME}``. With no ``storage`` in the file, `STORAGE_ENV` is used when it is set; a ``study`` reference
  with no ``storage`` reads `REFERENCE_STORAGE_ENV`.
- A URL with a literal password handed to Ray workers is replaced by ``${`SECRET_ENV_PREFIX`<n>}`` and the
  URL put into that variable of the driver's environment, which a local Ray's workers inherit (`hide_url`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import quote, unquote

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


# A query (or conninfo) parameter that holds a secret: its name (case-insensitive, percent-decoded) contains
# one of these. ``passfile`` names a file of passwords: its name is masked too, its contents never read.
_SECRET_PARAM = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)
# ``?name=value`` / ``&name=value`` / ``;name=value`` in a URL, or ``name=value`` after a space (libpq's
# conninfo form) or ``'name': 'value'`` (a dict of connect arguments in a driver's message).
_PARAM = re.compile(r"(?P<head>(?:[?&;]|(?<![^\s,({]))(?P<key>[A-Za-z0-9_.%\-]+)=)(?P<val>[^&;#\s'\"]*)")
_DICT_PARAM = re.compile(r"(?P<head>['\"](?P<key>[A-Za-z0-9_.\-]+)['\"]\s*:\s*['\"])(?P<val>[^'\"]*)")
# Secrets seen in URLs by this process (plain and percent-encoded forms), masked wherever they appear.
_KNOWN_SECRETS: set[str] = set()
#: Secrets shorter than this are not masked wherever they appear (only in their place in a URL): a password
#: "ab" would mask every "ab" of every message.
MIN_KNOWN_SECRET = 4


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


#: Characters of a file path kept as they are in a SQLite URL; the others (``?``, ``#``, ``%``, ...) are
#: percent-encoded, which SQLAlchemy decodes: ``res?x=1`` would otherwise start the URL's query string.
_SQLITE_PATH_SAFE = "/-_.~ ,=:@!$&'()*;[]"


def sqlite_url(path: str | os.PathLike[str]) -> str:
    """The SQLite URL of the file ``path`` (absolute or relative), with the characters that a URL reads
    specially percent-encoded; `sqlite_file` gives ``path`` back."""
    return "sqlite:///" + quote(os.fspath(path), safe=_SQLITE_PATH_SAFE)


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL (query string dropped, percent-encoding decoded, as SQLAlchemy
    reads it), or None for another scheme."""
    if not url.startswith("sqlite"):
        return None
    _, sep, rest = url.partition(":///")
    return Path(unquote(rest.split("?", 1)[0])) if sep else None


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
    mask_text(value)  # remember its secrets, so that any message quoting them later is masked
    return value


def mask_url(url: str) -> str:
    """``url`` with every secret in it (password, secret query parameters) replaced by ``***``."""
    return mask_text(url)


def _is_secret_key(key: str) -> bool:
    return bool(_SECRET_PARAM.search(unquote(key)))


def _remember(secret: str) -> None:
    for form in {secret, unquote(secret), quote(unquote(secret), safe=""), quote(unquote(secret))}:
        if len(form) >= MIN_KNOWN_SECRET:
            _KNOWN_SECRETS.add(form)


def mask_text(text: str) -> str:
    """``text`` with every secret of every URL in it replaced by ``***`` (for messages and stored text): the
    userinfo password, secret query parameters (`_SECRET_PARAM`), and any secret this process has seen."""

    def userinfo(m: re.Match[str]) -> str:
        if not m.group("pw"):
            return m.group(0)
        _remember(m.group("pw"))
        return f"{m.group('head')}:***@"

    def param(m: re.Match[str]) -> str:
        if not m.group("val") or not _is_secret_key(m.group("key")) or m.group("val") == "***":
            return m.group(0)
        _remember(m.group("val"))
        return f"{m.group('head')}***"

    if "://" in text and "@" in text:
        text = _CREDENTIALS.sub(userinfo, text)
    if "=" in text:
        text = _PARAM.sub(param, text)
    if ":" in text:
        text = _DICT_PARAM.sub(param, text)
    for secret in sorted(_KNOWN_SECRETS, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, "***")
    return text


def has_password(url: str | None) -> bool:
    """True when ``url`` holds a secret (a userinfo password or a secret query parameter)."""
    return url is not None and mask_text(url) != url


def hide_url(url: str) -> str:
    """A form of ``url`` safe to persist: a literal password is moved into an environment variable of this
    process (inherited by the workers of a local Ray) and ``${VAR}`` returned; other URLs as they are."""
    import hashlib  # here, not at the top: `collapse-hpo --help` loads this module and stays fast

    if not has_password(url):
        return url
    name = SECRET_ENV_PREFIX + hashlib.sha256(url.encode()).hexdigest()[:12].upper()
    os.environ[name] = url
    return "${" + name + "}"
