"""A throwaway PostgreSQL server for the tests: initdb into a temporary folder, started on a free port of
127.0.0.1, stopped and deleted afterwards. Password authentication over TCP, as workers on other machines use.
A watchdog process stops and deletes it once the process that started it is gone, however that process ended
(a finished session, Ctrl-C on pytest, a killed xdist worker), so no server outlives its tests.

The server binaries come from the Debian package `postgresql` (.ci/run installs it). initdb refuses to run as
root, so as root the server runs as the `postgres` user the package creates. Without the binaries the
tests that need a server are skipped, except in CI (CI=true), where that is a failure that says why.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

SUPERUSER, SUPERUSER_PASSWORD = "postgres", "fa4tune-test-superuser"


def server_bin() -> Path | None:
    """The folder of initdb/pg_ctl (the newest Debian version), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[3]) if Path(p).parts[3].isdigit() else 0)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("initdb")
    return Path(which).resolve().parent if which else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Run by the watchdog: wait for the owner to go, then stop the server (immediate) and delete its folder.
WATCHDOG = """
import os, shutil, subprocess, sys, time
owner, root, stop = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
while True:
    try:
        os.kill(owner, 0)
    except ProcessLookupError:
        break
    time.sleep(0.2)
subprocess.run(stop, capture_output=True, timeout=120)
shutil.rmtree(root, ignore_errors=True)
"""


class PostgresServer:
    """One server; `url(user, password, database)`, `create_role`, `create_database`."""

    def __init__(self, bin_dir: Path):
        self.bin_dir = bin_dir
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="fa4tune-pg-"))
        self.data = self.root / "data"
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> "PostgresServer":
        pwfile = self.root / "pw"
        pwfile.write_text(SUPERUSER_PASSWORD + "\n")
        if self.as_user:
            os.chmod(self.root, 0o755)
            shutil.chown(self.root, "postgres")
            shutil.chown(pwfile, "postgres")
        self._run(str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={pwfile}",
                  "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync", "-E", "UTF8", "--locale=C")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        stop = [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"]
        # its own session: a Ctrl-C sent to pytest's process group does not reach it
        self.watchdog = subprocess.Popen([sys.executable, "-c", WATCHDOG, str(os.getpid()), str(self.root), *stop],
                                         start_new_session=True, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "-t", "60", "start")
        return self

    def postmaster_pid(self) -> int | None:
        """The server's process id while it runs (its postmaster.pid), else None."""
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        try:
            self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
            self.watchdog.kill()

    def url(self, user: str = SUPERUSER, password: str = SUPERUSER_PASSWORD, database: str = "postgres") -> str:
        return f"postgresql://{user}:{password}@127.0.0.1:{self.port}/{database}"

    def execute(self, sql: str) -> None:
        import psycopg2

        connection = psycopg2.connect(self.url())
        connection.autocommit = True
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
        finally:
            connection.close()

    def create_role(self, user: str, password: str) -> None:
        self.execute(f"CREATE ROLE {user} LOGIN PASSWORD '{password}'")

    def create_database(self, name: str, owner: str = SUPERUSER) -> None:
        self.execute(f"CREATE DATABASE {name} OWNER {owner}")


@pytest.fixture(scope="session")
def postgres():
    """A running server for the session; skipped without the binaries (a failure in CI)."""
    bin_dir = server_bin()
    if bin_dir is None:
        message = "PostgreSQL server binaries not found (apt-get install postgresql; .ci/run does)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    server = PostgresServer(bin_dir).start()
    deadline = time.time() + 30
    while True:  # pg_ctl -w returns once the server accepts connections; a last check for password login
        try:
            server.execute("SELECT 1")
            break
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.2)
    try:
        yield server
    finally:
        server.stop()
