"""Storage faults: a damaged database or a full disk, said in one line that names the file.

SQLite reports a damaged file as "database disk image is malformed" or "file is not a database", and a full
disk as "database or disk is full"; PostgreSQL as SQLSTATE 53100 (disk full) or XX001/XX002 (data or index
corrupted). Optuna wraps each of them in a ``StorageInternalError`` that blames "invalid data in the commit,
e.g. exceeding max length", which hides the cause. `watch` registers one SQLAlchemy ``handle_error``
listener for every engine of the process (Optuna's, the lease's, the preflight's, the dashboard's): such an
error becomes a `StorageFault` naming the file (or the masked server URL) and the cause, raised in place of
the database error, so it reaches the command line as one line (exit 2) and the runner can tell a storage
fault from a trial's own failure (a storage fault charges no retry).

A full disk can also refuse a plain file write (``OSError`` ENOSPC, e.g. Ray Tune's experiment state in the
results folder): `find_fault` finds either kind in an exception's chain.

`SpaceReserve` keeps a small file next to a SQLite study while a driver runs; when the disk fills, the driver
removes it to get the room its last writes need (marking the running trials interrupted, releasing its
lease), so a full disk stops the sweep cleanly instead of leaving it half-recorded.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path
from typing import Any

from collapse_hpo.hpo.sweep.urls import mask_url, sqlite_file
from collapse_hpo.predictors.errors import InputError

#: What a damaged database tells the user to do.
DAMAGED_ADVICE = "restore it from a copy (or start a new sweep elsewhere with --results DIR)"
#: What a full disk tells the user to do.
FULL_ADVICE = "free space, then run the command again (what was stored before is kept)"
# SQLite primary result codes (https://www.sqlite.org/rescode.html).
_SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_NOTADB = 11, 13, 26
_SQLITE_DAMAGED_TEXT = ("database disk image is malformed", "file is not a database")
# PostgreSQL SQLSTATEs: disk_full, data_corrupted, index_corrupted.
_PG_FULL, _PG_DAMAGED = {"53100"}, {"XX001", "XX002"}
#: Bytes `SpaceReserve` keeps aside: far more than the driver's last writes need (a few SQLite pages each).
RESERVE_BYTES = 1 << 20


class StorageFault(InputError):
    """The sweep's storage cannot be used: its database is damaged (``kind`` "damaged") or its disk is full
    (``kind`` "full"); ``kind`` "storage" when the driver re-raises one a trial's worker told it of. The
    message is one line naming the file (or the masked server URL)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:200]


def classify(err: BaseException, where: str) -> StorageFault | None:
    """The `StorageFault` that ``err`` (a DB-API error or an ``OSError``) is, for the file or URL ``where``;
    None when it is another error (a lock, a lost connection, a bad statement)."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        path = err.filename if err.filename is not None else where
        return StorageFault(f"{path}: disk full ({err.strerror or 'no space left on device'}); "
                            f"{FULL_ADVICE}", "full")
    code = getattr(err, "sqlite_errorcode", None)
    text = _first_line(err)
    sqlstate = getattr(err, "sqlstate", None) or getattr(err, "pgcode", None)
    if isinstance(code, int):
        primary = code & 0xFF
        if primary in (_SQLITE_CORRUPT, _SQLITE_NOTADB):
            return StorageFault(f"{where}: damaged database ({text}): {DAMAGED_ADVICE}", "damaged")
        if primary == _SQLITE_FULL:
            return StorageFault(f"{where}: disk full ({text}); {FULL_ADVICE}", "full")
        return None
    if any(t in text for t in _SQLITE_DAMAGED_TEXT):
        return StorageFault(f"{where}: damaged database ({text}): {DAMAGED_ADVICE}", "damaged")
    if sqlstate in _PG_FULL:
        return StorageFault(f"{where}: disk full on the database server ({text}); free space on the "
                            "server, then run the command again", "full")
    if sqlstate in _PG_DAMAGED:
        return StorageFault(f"{where}: damaged database ({text}): restore it from a backup", "damaged")
    return None


def find_fault(err: BaseException | None) -> StorageFault | None:
    """The `StorageFault` in ``err``'s chain (``__cause__`` / ``__context__``): one raised by `watch`, or a
    full disk refusing a file write (``OSError`` ENOSPC); None when there is none."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, StorageFault):
            return err
        if isinstance(err, OSError):
            fault = classify(err, "a file")
            if fault is not None:
                return fault
        err = err.__cause__ or err.__context__
    return None


def _where(url: Any) -> str:
    """The file of a SQLite URL, else the URL with its password masked."""
    if url is None:
        return "the database"
    if url.get_backend_name() == "sqlite":
        return str(url.database or "the SQLite database")
    return mask_url(url.render_as_string(hide_password=True))


def _on_error(context: Any) -> None:
    engine = getattr(context, "engine", None)
    fault = classify(context.original_exception, _where(engine.url if engine is not None else None))
    if fault is not None:
        raise fault from context.original_exception


def watch() -> None:
    """Turn every storage fault of every SQLAlchemy engine of this process into a `StorageFault` (once per
    process; called by the command line and by each trial's worker)."""
    import sqlalchemy
    from sqlalchemy.engine import Engine

    if not sqlalchemy.event.contains(Engine, "handle_error", _on_error):
        sqlalchemy.event.listen(Engine, "handle_error", _on_error)


class SpaceReserve:
    """``RESERVE_BYTES`` kept aside in the folder of a SQLite study (file ``.<db name>.<study>.reserve``)
    while its driver runs, and given back (`free`) when the disk is full so that the driver's last writes fit.

    ``storage_url`` is resolved (no ``${NAME}``). Nothing is kept for a database server (its disk is not ours
    to manage)."""

    def __init__(self, storage_url: str, study_name: str) -> None:
        self.path: Path | None = None

        db = sqlite_file(storage_url)  # percent-encoding decoded: the default URL encodes odd folder names
        if db is not None:
            safe = re.sub(r"[^A-Za-z0-9._-]", "_", study_name)[:100]
            self.path = db.with_name(f".{db.name}.{safe}.reserve")

    def keep(self) -> None:
        """Write the reserve; a `StorageFault` (disk full) when even that does not fit. A folder that refuses
        it for another reason keeps none (the storage's own checks say what is wrong with it)."""
        if self.path is None:
            return
        try:
            with self.path.open("wb") as fh:
                fh.write(b"\0" * RESERVE_BYTES)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:
            self.free()
            fault = classify(err, str(self.path))
            self.path = None
            if fault is not None:
                raise fault from None

    def free(self) -> None:
        """Remove the reserve (the room it held is free for the driver's last writes)."""
        if self.path is not None:
            with contextlib.suppress(OSError):
                self.path.unlink()
