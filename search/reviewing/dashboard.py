"""`python -m search dashboard`: optuna-dashboard on the project's storage, with fa4-tune's notes.

The port is bound before anything is written, so a port in use is a one-line error and the storage is
left as it was. Then every search study gets its notes (search.reviewing.notes) and optuna-dashboard's WSGI app is
served by a threaded wsgiref server (a browser loads the page's files in parallel).
"""

from __future__ import annotations

import errno
import sys
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from fa4tune.config import ConfigError
from search import optional
from search.storing.storage import describe, open_existing_storage

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
LOOPBACK = ("127.0.0.1", "localhost")


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # one line per asset request would drown the start message
        pass


def bind(host: str, port: int) -> WSGIServer:
    """A server bound to host:port (no app yet); a one-line error when the port is taken."""
    try:
        return make_server(host, port, None, server_class=_ThreadingServer, handler_class=_QuietHandler)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ConfigError("port_in_use", f"port {port} on {host} is in use: pass --port with a free port")
        raise ConfigError("dashboard_bind", f"cannot listen on {host}:{port}: {err.strerror or err}")


def serve(url: str, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, table: dict | None = None, out=None) -> int:
    """Writes the notes and serves the dashboard until Ctrl-C; 0 then. `table`: notes.table_meta of a replayed table."""
    missing = optional.why_missing("optuna_dashboard")
    if missing:  # before the storage is opened or the port bound: nothing happens
        raise ConfigError("optional_package", f"the dashboard needs the optuna-dashboard package: {missing}")
    import optuna_dashboard

    from search.reviewing.notes import write_notes

    out = out or sys.stdout
    storage = open_existing_storage(url)
    server = bind(host, port)
    try:
        if host not in LOOPBACK:
            print(f"warning: serving on {host}, not {DEFAULT_HOST}: optuna-dashboard has no login, and anyone who reaches "
                  f"this port can read, rename and delete the studies", file=sys.stderr)
        print(f"storage: {describe(url)}", file=out)
        written, kept = write_notes(storage, table=table)
        print(f"notes: {written} written" + (f", {kept} edited by hand left alone" if kept else ""), file=out)
        server.set_app(optuna_dashboard.wsgi(storage))
        print(f"optuna-dashboard: http://{host}:{server.server_port}/dashboard (Ctrl-C stops)", file=out, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
