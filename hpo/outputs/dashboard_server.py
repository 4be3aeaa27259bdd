"""Serving optuna-dashboard (``collapse-hpo dashboard``): who may reach it, what they may change, and a server
that answers clients concurrently.

optuna-dashboard has no authentication: whoever reaches its port can read every study in the storage and
change or delete them (``DELETE /api/studies/1``). So:

- it listens on a loopback address unless ``allow_remote`` is given (`check_host`), and a remote server is
  read-only by default and announced by a loud warning (`remote_warning`);
- read-only (`read_only_app`): every request but GET, HEAD and OPTIONS is refused with 403 before it
  reaches optuna-dashboard (all its writes are POST, PUT or DELETE);
- one thread per connection (`make_server`): an idle or slow client (a browser's pre-opened connection, a
  port scanner) does not hold up the others, as it did with wsgiref's one-request-at-a-time server.

The recommended way to share a dashboard is an SSH tunnel to a loopback server (README, "Reviewing a sweep").
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from collapse_hpo.predictors.errors import InputError

#: The HTTP methods a read-only dashboard answers; the others get 403.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def is_loopback(host: str) -> bool:
    """True when ``host`` (an address or a name) only ever means this machine: every address it resolves to
    is a loopback address. ``0.0.0.0`` and ``::`` (every interface) are not."""
    import ipaddress  # here and below, not at the top: `collapse-hpo --help` loads this module
    import socket

    name = host.strip("[]")
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None)
    except OSError:
        return False  # unresolvable: binding fails later with its own message
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in addresses)


def check_host(host: str, allow_remote: bool) -> bool:
    """Whether ``host`` is reachable from other machines; InputError (one line) when it is and
    ``allow_remote`` is False."""
    if is_loopback(host):
        return False
    if not allow_remote:
        raise InputError(
            f"dashboard: --host {host} makes the dashboard reachable from other machines, with no "
            "authentication (anyone could read and delete the studies); use an SSH tunnel to 127.0.0.1 "
            "(ssh -L 8080:127.0.0.1:8080 THIS_HOST), or add --allow-remote (read-only unless --no-read-only)"
        )
    return True


def remote_warning(host: str, port: int, read_only: bool) -> str:
    """The warning printed when the dashboard listens beyond this machine."""
    what = ("read every study (changes are refused: read-only)" if read_only else
            "read, change and DELETE every study (--no-read-only)")
    return (f"WARNING: the dashboard listens on {host}:{port}, reachable from other machines with NO "
            f"authentication: anyone who reaches this port can {what}; an SSH tunnel to 127.0.0.1 is safer")


def read_only_app(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    """``app`` answering only `READ_METHODS`; other requests get 403 and never reach ``app``."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method = str(environ.get("REQUEST_METHOD", "GET")).upper()
        if method in READ_METHODS:
            return app(environ, start_response)
        body = (f"read-only dashboard: {method} is refused; run `collapse-hpo dashboard` on 127.0.0.1 "
                "to change studies\n").encode()
        start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("Content-Length", str(len(body)))])
        return [body]

    return guarded


def make_server(storage: str, host: str = "127.0.0.1", port: int = 8080, *, read_only: bool = False) -> Any:
    """A threading WSGI server running optuna-dashboard on ``storage`` (port 0 = any free port); not yet
    serving. Each connection gets its own (daemon) thread.

    Raises InputError when the storage cannot be opened or the port cannot be bound.
    """
    import socket
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    import optuna_dashboard

    class _Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # wsgiref's signature
            return

    class _Threading(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True  # Ctrl-C does not wait for idle clients
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    from collapse_hpo.hpo.outputs.dashboard_page import page_app  # deferred: pulls numpy; --help stays fast

    try:
        app = page_app(optuna_dashboard.wsgi(storage), storage)  # the collapse figure first, at full width
    except Exception as err:
        raise InputError(f"storage {storage!r}: cannot open it for the dashboard ({type(err).__name__}: "
                         f"{err}); check the URL") from None
    try:
        server = _Threading((host.strip("[]"), port), _Quiet)
    except OSError as err:
        raise InputError(f"dashboard: cannot listen on {host}:{port} ({err}); choose another --port") \
            from None
    server.set_app(read_only_app(app) if read_only else app)
    return server


def dashboard_url(server: Any) -> str:
    """The URL a browser opens for a server from ``make_server``."""
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/dashboard/"


def serve(storage: str, host: str = "127.0.0.1", port: int = 8080, *, read_only: bool = False,
          out: Any = None, shown: str | None = None) -> None:
    """Run optuna-dashboard on ``storage`` until interrupted, after printing its URL (a line on ``out``).

    ``shown`` is how the storage is named in that line (e.g. the URL without its password).
    """
    server = make_server(storage, host, port, read_only=read_only)
    out = out or sys.stdout
    mode = " read-only," if read_only else ""
    print(f"optuna-dashboard on {shown or storage}:{mode} {dashboard_url(server)}  (Ctrl-C to stop)",
          file=out, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
