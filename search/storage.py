"""Optuna storage by URL: sqlite:///PATH (default sqlite:///search.db) or postgresql://USER@HOST/DB.

Bad URLs and unreachable databases become one-line ConfigErrors before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from fa4tune.config import ConfigError

DEFAULT_STORAGE = "sqlite:///search.db"
SCHEMES = ("sqlite", "postgresql")  # postgresql through psycopg2 (postgresql+psycopg2:// works too)
_SQLITE_HEADER = b"SQLite format 3\x00"


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
        if path.exists() and path.stat().st_size and not path.read_bytes()[:16] == _SQLITE_HEADER:
            raise ConfigError("storage_unreachable", f"cannot open {url}: {str(path)!r} is not a SQLite database")


def open_storage(url: str):
    """An Optuna RDBStorage for the URL; one-line ConfigError when the database cannot be reached."""
    import optuna
    import sqlalchemy.exc

    check_url(url)
    engine_kwargs = {"connect_args": {"connect_timeout": 10}} if url.startswith("postgresql") else {}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError, ImportError) as err:
        first_line = str(getattr(err, "orig", None) or err).strip().splitlines()[0]
        raise ConfigError("storage_unreachable", f"cannot open {describe(url)}: {first_line}")


def _sqlite_path(url: str) -> Path:
    return Path(url[len("sqlite:///"):])
