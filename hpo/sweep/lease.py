"""One driver per sweep: a lease row in the sweep's own storage, kept alive by a heartbeat.

`SweepLease.acquire` inserts ``(sweep, holder, acquired, heartbeat)`` into the table ``collapse_hpo_leases``
of the Optuna storage (created if missing; several drivers creating it at once is retried). While the driver
runs, a daemon thread refreshes ``heartbeat`` every ``interval`` seconds; `release` deletes the row. A second
`run` or `resume` of the same sweep finds the row and is refused with one line naming the holder
(``host:pid``) and its age, unless the lease lapsed:

- the holder runs on this host and its process is gone (taken over at once), or
- its heartbeat is older than ``expiry`` seconds (a dead driver on another host): a driver that finds a fresh
  lease waits up to ``expiry`` + 2 · ``interval`` seconds for it to lapse before it gives up.

Taking a lapsed lease is a compare-and-swap on the old heartbeat, so of two drivers taking it at once exactly
one wins. Times are the drivers' wall clocks (seconds since the epoch).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from collapse_hpo.predictors.errors import InputError

TABLE = "collapse_hpo_leases"


def retry_races(fn: Callable[[], Any], tries: int = 6) -> Any:
    """Run ``fn``, again after a short pause when the database reports a race (a table or row created by
    another driver at the same moment: Optuna's tables on a fresh storage, this module's lease table)."""
    import sqlalchemy.exc

    for attempt in range(tries):
        try:
            return fn()
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError,
                sqlalchemy.exc.OperationalError):
            if attempt == tries - 1:
                raise
            time.sleep(0.2 * (attempt + 1))
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SweepLease:
    """The lease of sweep ``name`` in the storage at ``url`` (a resolved SQLAlchemy URL).

    Args:
        interval: seconds between heartbeats.
        expiry: seconds without a heartbeat after which the lease lapsed.
        where: the prefix of the refusal message (the sweep file).
    """

    def __init__(self, url: str, name: str, *, interval: float, expiry: float, where: str) -> None:
        self.url, self.name, self.interval, self.expiry, self.where = url, name, interval, expiry, where
        self.holder = f"{socket.gethostname()}:{os.getpid()}"
        self.token = uuid.uuid4().hex
        self._engine: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ database
    def _connect(self) -> Any:
        if self._engine is None:
            import sqlalchemy

            from collapse_hpo.hpo.sweep.trial import (
                storage_url,  # deferred: pulls pydantic; this module loads it only when used
            )

            kwargs: dict[str, Any] = {}
            if self.url.startswith("sqlite"):
                kwargs["connect_args"] = {"timeout": 60}
            self._engine = sqlalchemy.create_engine(storage_url(self.url), **kwargs)
        return self._engine

    def _create_table(self) -> None:
        import sqlalchemy

        def create() -> None:
            with self._connect().begin() as conn:
                if not sqlalchemy.inspect(conn).has_table(TABLE):
                    conn.execute(sqlalchemy.text(
                        f"CREATE TABLE IF NOT EXISTS {TABLE} (sweep VARCHAR(512) PRIMARY KEY, "
                        "holder VARCHAR(512) NOT NULL, token VARCHAR(64) NOT NULL, "
                        "acquired DOUBLE PRECISION NOT NULL, heartbeat DOUBLE PRECISION NOT NULL)"))

        retry_races(create)

    def _row(self) -> tuple[str, str, float, float] | None:
        import sqlalchemy

        with self._connect().connect() as conn:
            row = conn.execute(sqlalchemy.text(
                f"SELECT holder, token, acquired, heartbeat FROM {TABLE} WHERE sweep = :s"),
                {"s": self.name}).fetchone()
        return None if row is None else (str(row[0]), str(row[1]), float(row[2]), float(row[3]))

    def _insert(self) -> bool:
        import sqlalchemy
        import sqlalchemy.exc

        now = time.time()
        try:
            with self._connect().begin() as conn:
                conn.execute(sqlalchemy.text(
                    f"INSERT INTO {TABLE} (sweep, holder, token, acquired, heartbeat) "
                    "VALUES (:s, :h, :t, :a, :b)"),
                    {"s": self.name, "h": self.holder, "t": self.token, "a": now, "b": now})
            return True
        except sqlalchemy.exc.IntegrityError:
            return False

    def _take_over(self, old_token: str, old_beat: float) -> bool:
        import sqlalchemy

        now = time.time()
        with self._connect().begin() as conn:
            res = conn.execute(sqlalchemy.text(
                f"UPDATE {TABLE} SET holder = :h, token = :t, acquired = :a, heartbeat = :b "
                "WHERE sweep = :s AND token = :ot AND heartbeat = :ob"),
                {"h": self.holder, "t": self.token, "a": now, "b": now, "s": self.name, "ot": old_token,
                 "ob": old_beat})
            return res.rowcount == 1

    def _beat(self) -> bool:
        import sqlalchemy

        with self._connect().begin() as conn:
            res = conn.execute(sqlalchemy.text(
                f"UPDATE {TABLE} SET heartbeat = :b WHERE sweep = :s AND token = :t"),
                {"b": time.time(), "s": self.name, "t": self.token})
            return res.rowcount == 1

    # ------------------------------------------------------------------ public
    def acquire(self, sleep: Callable[[float], None] = time.sleep,
                on_wait: Callable[[str], None] | None = None) -> None:
        """Take the lease or raise InputError naming the driver that holds it (see the module docstring)."""
        self._create_table()
        deadline = time.monotonic() + self.expiry + 2 * self.interval
        announced = False
        while True:
            if retry_races(self._insert):
                break
            row = retry_races(self._row)
            if row is None:
                continue  # released between our insert and our read: try again
            holder, token, acquired, beat = row
            host, _, pid = holder.rpartition(":")
            dead_here = host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid))
            lapsed = time.time() - beat > self.expiry
            if dead_here or lapsed:
                if retry_races(lambda t=token, b=beat: self._take_over(t, b)):
                    break
                continue
            local = host == socket.gethostname()
            if local or time.monotonic() > deadline:
                age = time.time() - acquired
                raise InputError(
                    f"{self.where}: sweep {self.name!r} is already run by driver {holder} (started "
                    f"{age:.0f} s ago, last heartbeat {time.time() - beat:.0f} s ago); wait for it to end, "
                    "or stop it first")
            if on_wait is not None and not announced:
                on_wait(f"waiting up to {self.expiry:.0f} s for the lease of driver {holder} to lapse")
                announced = True
            sleep(self.interval)
        self._thread = threading.Thread(target=self._loop, name=f"lease-{self.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            with contextlib.suppress(Exception):
                self._beat()

    def release(self) -> None:
        """Stop the heartbeat and delete the lease row (if it is still ours)."""
        import sqlalchemy

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception), self._connect().begin() as conn:
            conn.execute(sqlalchemy.text(f"DELETE FROM {TABLE} WHERE sweep = :s AND token = :t"),
                         {"s": self.name, "t": self.token})
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> SweepLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
