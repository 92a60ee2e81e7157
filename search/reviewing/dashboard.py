"""`python -m search dashboard`: optuna-dashboard on the project's storage, with fa4-tune's notes.

The port is bound before anything is written, so a port in use is a one-line error and the storage is
left as it was. Then every search study gets its notes (search.reviewing.notes) and its objective's name (the
plots' value axis), and optuna-dashboard's WSGI app is served by a threaded wsgiref server (a browser loads the
page's files in parallel).
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
        named = name_metrics(storage)
        print(f"notes: {written} written" + (f", {kept} edited by hand left alone" if kept else "")
              + (f"; objective named on {named} {'study' if named == 1 else 'studies'}" if named else ""), file=out)
        server.set_app(optuna_dashboard.wsgi(storage))
        print(f"optuna-dashboard: http://{host}:{server.server_port}/dashboard (Ctrl-C stops)", file=out, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def name_metrics(storage) -> int:
    """Names the objective of every search study that has no name for it yet (a study made before search.storing.study
    named it), so that the plots' value axis reads e.g. "fwd TFLOPS (geomean)" instead of "Objective 0"; how many."""
    import optuna

    from search.storing import schema
    from search.storing.study import name_metric

    named = 0
    for summary in optuna.study.get_all_study_summaries(storage, include_best_trial=False):
        direction = summary.user_attrs.get(schema.DIRECTION)
        if direction:
            named += name_metric(optuna.load_study(study_name=summary.study_name, storage=storage), direction)
    return named
