"""The state tests' second pass (issue 26): the same tests with `state.url` set, so what must be
shared between gateways (release chains, candidates, the ledger, reports' keys, the round log) lives
in a real PostgreSQL instead of files. `make test` runs it over STATE_TESTS with REEF_TEST_STATE=postgres.

Every backend switch reads REEF_STATE__URL when the config names no url (reef.core.pg.state_url),
and `reef serve` passes it on to its rounds, so setting it is all a test process needs. Each test
gets an empty database of its own: one per test file for the tests that share a module-scoped
server (its gateway was started with the file's database and keeps it), one per test otherwise, so
no test sees another's chains.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Iterator

import pytest

from reef.core.pg import STATE_URL_ENV
from reef.serve_process import ServeProcess
from tests.helpers.postgres import PostgresServer, postgres_or_skip

PASS_ENV = "REEF_TEST_STATE"
_names = itertools.count()


def enabled() -> bool:
    return os.environ.get(PASS_ENV) == "postgres"


def _database(server: PostgresServer, hint: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "_", hint.lower())[-40:]
    return server.create_database(f"s{os.getpid()}_{next(_names)}_{slug}")


@pytest.fixture(scope="session")
def state_server() -> Iterator[PostgresServer | None]:
    if not enabled():
        yield None
        return
    try:
        postgres_or_skip()
    except pytest.skip.Exception as exc:  # asked for by name: a pass of skips would look green
        pytest.fail(f"{PASS_ENV}=postgres, but no PostgreSQL here: {exc}")
    with PostgresServer.start() as server:
        yield server


def _set_url(url: str | None) -> None:
    if url is None:
        os.environ.pop(STATE_URL_ENV, None)
    else:
        os.environ[STATE_URL_ENV] = url


@pytest.fixture(scope="module", autouse=True)
def state_per_module(request: pytest.FixtureRequest, state_server: PostgresServer | None) -> Iterator[str | None]:
    """Autouse fixtures start first within their scope: the file's gateways see this database."""
    if state_server is None:
        yield None
        return
    before = os.environ.get(STATE_URL_ENV)
    url = _database(state_server, request.module.__name__)
    _set_url(url)
    yield url
    _set_url(before)


def _holds_wider_state(request: pytest.FixtureRequest) -> bool:
    """Whether the test talks to a server that outlives it (a module's `reef serve`, started with the
    module's database): then it keeps that database. A test that only reuses a module's files (a
    trained candidate) gets its own, or its chains would reach the module's server."""
    info = request.node._fixtureinfo  # type: ignore[attr-defined]
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "class", "package") and name != "state_per_module":
            # Set up already: wider fixtures are made before a test's own.
            if isinstance(request.getfixturevalue(name), ServeProcess):
                return True
    return False


@pytest.fixture(autouse=True)
def state_per_test(request: pytest.FixtureRequest, state_server: PostgresServer | None,
                   state_per_module: str | None) -> Iterator[None]:
    if state_server is None or _holds_wider_state(request):
        yield
        return
    _set_url(_database(state_server, request.node.name))
    yield
    _set_url(state_per_module)
