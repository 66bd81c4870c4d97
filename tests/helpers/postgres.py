"""A real PostgreSQL server for the tests of `state.url` (never a mock): Debian's binaries (`make
test` installs the `postgresql` package), `initdb` into a temporary folder, `pg_ctl start` on a free
loopback port, stopped and removed at the end.

initdb refuses to run as root: as root the server runs as `nobody` (through runuser), in a folder
it owns. Trust authentication on loopback only; fsync off (a test database need not survive a
power cut, and it makes commits cheap on a slow disk).

    from tests.helpers.postgres import PostgresServer, postgres_or_skip
    with PostgresServer.start() as pg:
        url = pg.create_database("t1")
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from reef.core.pg import STATE_URL_ENV

BIN_GLOB = "/usr/lib/postgresql/*/bin"
USER = "reef"


def find_bin() -> Path | None:
    """The newest installed PostgreSQL's bin folder (Debian keeps each major version apart)."""
    found = [Path(p) for p in glob.glob(BIN_GLOB) if (Path(p) / "initdb").is_file()]
    if not found and shutil.which("initdb"):
        return Path(shutil.which("initdb")).parent  # type: ignore[arg-type]
    return max(found, key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0) if found else None


def missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg is not installed (the `postgres` extra: pip install -e '.[postgres]')"
    if find_bin() is None:
        return f"no PostgreSQL server binaries under {BIN_GLOB} (Debian's postgresql package: make debs)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    def __init__(self, bindir: Path, root: Path, port: int, run_as: str | None) -> None:
        self.bindir = bindir
        self.root = root
        self.port = port
        self.run_as = run_as
        self.datadir = root / "db"
        self.options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -F -c max_connections=200"
                        " -c full_page_writes=off")

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", self.run_as, "--"] if self.run_as else []) + list(args)

    def _run(self, *args: str) -> None:
        out = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            log = (self.root / "server.log").read_text() if (self.root / "server.log").exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed: {out.stdout}{out.stderr}{log}")

    @classmethod
    @contextmanager
    def start(cls) -> Iterator[PostgresServer]:
        bindir = find_bin()
        assert bindir is not None, missing()
        run_as = "nobody" if os.geteuid() == 0 else None
        root = Path(tempfile.mkdtemp(prefix="reef-pg-"))  # not pytest's tmp_path: `nobody` cannot enter that
        if run_as:
            os.chown(root, pwd.getpwnam(run_as).pw_uid, -1)
        server = cls(bindir, root, _free_port(), run_as)
        try:
            server._run(str(bindir / "initdb"), "-D", str(server.datadir), "-A", "trust", "-U", USER,
                        "-E", "UTF8", "--no-sync", "--no-instructions")
            server.restart()
            yield server
        finally:
            if (server.datadir / "postmaster.pid").exists():
                subprocess.run(server._cmd(str(bindir / "pg_ctl"), "-D", str(server.datadir), "-m", "immediate",
                                           "-w", "stop"), capture_output=True, timeout=60)
            shutil.rmtree(root, ignore_errors=True)

    def stop(self) -> None:
        """Stop the server (as a crash or a failover would), keeping its data for `restart`."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-o", self.options, "-l",
                  str(self.root / "server.log"), "-w", "-t", "60", "start")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh, empty database: its URL."""
        import psycopg  # the optional extra: imported only where a server runs

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def postgres_or_skip() -> None:
    """Skip without psycopg or the server's binaries. `make test` installs the server in the
    background while the model-free tests run: it sets REEF_TEST_POSTGRES_WAIT_S, and the first
    PostgreSQL test waits up to that long for the package instead of skipping."""
    deadline = time.monotonic() + float(os.environ.get("REEF_TEST_POSTGRES_WAIT_S") or 0)
    while (reason := missing()) is not None and importlib.util.find_spec("psycopg") is not None \
            and time.monotonic() < deadline:
        time.sleep(2)
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One server for the test session (each test takes its own database from it)."""
    postgres_or_skip()
    with PostgresServer.start() as server:
        yield server


@pytest.fixture(params=["files", "postgres"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A test run on both backends: REEF_STATE__URL unset (files under the data dir), or a fresh
    database of the session's server. A module using it imports `postgres` too."""
    monkeypatch.delenv(STATE_URL_ENV, raising=False)
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres")
        monkeypatch.setenv(STATE_URL_ENV, server.create_database(f"state_{uuid.uuid4().hex[:12]}"))
    return str(request.param)


@pytest.fixture
def pg_url(postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh database of the session's server, named in REEF_STATE__URL for what the test runs."""
    url = postgres.create_database(f"state_{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv(STATE_URL_ENV, url)
    return url
