"""Optuna storage by URL: sqlite:///PATH (default sqlite:///search.db) or postgresql://USER@HOST/DB.

Bad URLs and unreachable databases become one-line ConfigErrors before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from fa4tune.config import ConfigError

DEFAULT_STORAGE = "sqlite:///search.db"
SCHEMES = ("sqlite", "postgresql")  # postgresql through psycopg2 (postgresql+psycopg2:// works too)


def describe(url: str) -> str:
    """Where the studies live, for the line printed at start: the absolute file, or the URL without password."""
    if url.startswith("sqlite:///"):
        return f"sqlite file {_sqlite_path(url).resolve()}"
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def check_url(url: str) -> None:
    """Rejects an unknown scheme or an impossible SQLite path without touching anything."""
    scheme = url.split("://", 1)[0].split("+", 1)[0] if "://" in url else ""
    if scheme not in SCHEMES:
        raise ConfigError("storage_url", f"unknown storage URL scheme {scheme or url!r} (use sqlite:///PATH or postgresql://USER@HOST/DB)")
    if scheme == "sqlite":
        if not url.startswith("sqlite:///") or url == "sqlite:///":
            raise ConfigError("storage_url", f"a SQLite storage URL is sqlite:///PATH, got {url!r}")
        path = _sqlite_path(url)
        if not path.parent.is_dir():
            raise ConfigError("storage_unreachable", f"cannot open {url}: directory {str(path.parent)!r} does not exist")
        if path.exists() and path.stat().st_size and not _is_sqlite(path):
            raise ConfigError("storage_unreachable", f"cannot open {url}: {str(path)!r} is not a SQLite database")


def _is_sqlite(path: Path) -> bool:
    """Whether a file is a SQLite database, asked through SQLite itself: closing a plain file handle on the
    database would drop this process's SQLite locks on it, and another process could then delete the WAL."""
    import sqlite3

    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return False
    try:
        connection.execute("PRAGMA schema_version")
        return True
    except sqlite3.DatabaseError:
        return False
    finally:
        connection.close()


def _driver_url(url: str) -> tuple[str, dict]:
    """The URL SQLAlchemy is given (a bare postgresql:// is psycopg 3 to SQLAlchemy 2.1; the installed driver is
    psycopg2) and the engine's arguments."""
    engine_kwargs = {"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else {}
    return ("postgresql+psycopg2://" + url[len("postgresql://"):] if url.startswith("postgresql://") else url), engine_kwargs


def check_reachable(url: str) -> None:
    """check_url, and for a server, one connection that writes nothing: a run refuses an unreachable database before
    it loads experiment.py."""
    check_url(url)
    if not url.startswith("postgresql"):
        return
    import sqlalchemy

    driver_url, engine_kwargs = _driver_url(url)
    engine = sqlalchemy.create_engine(driver_url, **engine_kwargs)
    try:
        engine.connect().close()
    except (sqlalchemy.exc.SQLAlchemyError, ImportError) as err:
        first_line = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ConfigError("storage_unreachable", f"cannot open {describe(url)}: {first_line}")
    finally:
        engine.dispose()


def open_storage(url: str):
    """An Optuna RDBStorage for the URL; one-line ConfigError when the database cannot be reached."""
    import optuna
    import sqlalchemy.exc

    check_url(url)
    driver_url, engine_kwargs = _driver_url(url)
    try:
        storage = optuna.storages.RDBStorage(driver_url, engine_kwargs=engine_kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError) as err:
        first_line = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ConfigError("storage_unreachable", f"cannot open {describe(url)}: {first_line}")
    if url.startswith("sqlite"):
        _write_ahead_log(storage.engine)
    return storage


def _write_ahead_log(engine) -> None:
    """SQLite in WAL mode with synchronous=NORMAL: a commit survives a killed process without an fsync each.

    A trial writes a dozen attributes, each its own transaction; with the default rollback journal
    every one of them waits for the disk.
    """
    import sqlalchemy

    def on_connect(connection, record):
        cursor = connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections opened before the listener reconnect with it


def _sqlite_path(url: str) -> Path:
    return Path(url[len("sqlite:///"):])


def open_existing_storage(url: str):
    """Like open_storage, but a SQLite file that does not exist is an error instead of a new database."""
    check_url(url)
    if url.startswith("sqlite:///") and not _sqlite_path(url).exists():
        raise ConfigError("storage_empty", f"no studies: {describe(url)} does not exist")
    return open_storage(url)
