"""A private PostgreSQL server (its own data folder and port) that a test or a benchmark may
stop and start: the shared server on 5432 belongs to everyone and is never restarted."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.server import free_port

BINARIES = ("initdb", "pg_ctl", "postgres")


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / name).exists():
            return str(folder / name)
    return None


def unavailable() -> str | None:
    """Why no private server can run here, or None."""
    missing = [name for name in BINARIES if _bin(name) is None]
    if missing:
        return f"PostgreSQL server binaries not found: {', '.join(missing)}"
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        return "running as root without runuser (PostgreSQL refuses to run as root)"
    return None


class PostgresCluster:
    """initdb, start, stop, restart; trust auth on 127.0.0.1, no Unix socket."""

    def __init__(self, *, user: str = "postgres"):
        self.user = user
        self.port = free_port()
        # PostgreSQL runs as its own user when we are root: the folder must be reachable by it
        self.root = Path(tempfile.mkdtemp(prefix="faultline-pg-", dir="/tmp"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.log = self.root / "server.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/postgres"

    def database_url(self, name: str) -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{name}"

    def _run(self, *args: str) -> None:
        command = list(args)
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed: {done.stderr.strip() or done.stdout.strip()}")

    def init(self) -> PostgresCluster:
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run(_bin("initdb"), "-D", str(self.data), "-U", self.user, "-A", "trust", "-E", "UTF8",
                  "--locale=C", "--no-sync")
        return self

    def start(self) -> None:
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories='' "
                   "-c fsync=off -c max_connections=200")
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.log), "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast` disconnects every client, as a restart or a failover does."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"postgresql://{self.user}@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except RuntimeError:
            pass  # not running
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        self.init()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()
