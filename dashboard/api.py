"""Actions and live state through the running server (`reef.client.ReefClient`, the release API).

Every action names the head the page showed as `expected_parent`: if someone else released in the
meantime the server answers 409 `head_moved`, nothing changes, and the page says so plainly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import streamlit as st


@dataclass(frozen=True)
class Outcome:
    ok: bool
    message: str
    code: str | None = None  # the API's error code ("head_moved", "not_selected", ...) or "unreachable"
    body: dict[str, Any] | None = None


@st.cache_data(ttl=3, show_spinner=False)
def server_status(url: str) -> dict[str, Any] | None:
    """`GET /reef/status`, or None when the server does not answer."""
    try:
        response = httpx.get(f"{url}/reef/status", timeout=2.0)
        return response.json() if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def serving(url: str, scenario: str) -> dict[str, Any] | None:
    """The server's view of the scenario's releases (`head`, `releases`, `serving`), or None."""
    from reef.client import ReefClient

    try:
        with ReefClient(url, admin_token="", timeout_s=5.0) as client:
            return client.releases(scenario)
    except Exception:  # noqa: BLE001 - shown as "server not reachable"
        return None


def _client(url: str, token: str | None) -> Any:
    from reef.client import ReefClient

    # "" not None: without a token the client must not fall back to REEF_ADMIN_TOKEN behind the page's back.
    return ReefClient(url, admin_token=token or "", timeout_s=600.0)


def _run(what: str, url: str, token: str | None, call: Callable[[Any], Any],
         done: Callable[[dict[str, Any]], str]) -> Outcome:
    """`call(client)`, its refusal said plainly, or `done(body)` as the success message."""
    from reef.client import HeadMovedError, ReefAPIError

    try:
        with _client(url, token) as client:
            body = call(client)
    except HeadMovedError as exc:
        return Outcome(False, f"{what} refused, the head moved: {exc.message} The page now shows the new "
                              "head: check it before deciding again.", "head_moved")
    except ReefAPIError as exc:
        if exc.status == 401:
            return Outcome(False, f"{what} refused: the admin token is wrong or missing.", exc.code or "unauthorized")
        if exc.status == 403:
            return Outcome(False, f"{what} refused: the server has no admin token configured "
                                  "(`admin_token` in serve.yaml or REEF_ADMIN_TOKEN).", exc.code or "forbidden")
        return Outcome(False, f"{what} refused (HTTP {exc.status} {exc.code or ''}): {exc.message}", exc.code)
    except httpx.HTTPError as exc:
        return Outcome(False, f"{what} failed: cannot reach the server ({exc}).", "unreachable")
    body = body if isinstance(body, dict) else None
    return Outcome(True, done(body) if body else f"{what}: done.", None, body)


def _swap_ms(body: dict[str, Any]) -> str:
    ms = (body.get("swap") or {}).get("ms")
    return f" (swap {ms:.0f} ms)" if isinstance(ms, int | float) else ""


def release(url: str, token: str | None, scenario: str, candidate_id: str, expected_parent: str,
            by: str | None, harness: str | None = None) -> Outcome:
    """A weights or harness candidate; with `harness`, weights and a harness in one step (composite)."""
    what = f"{candidate_id[:12]} with harness {harness[:12]}" if harness else candidate_id[:12]
    return _run(f"Releasing {what}", url, token, lambda c: c.release(
        scenario, candidate_id, expected_parent=expected_parent, approved_by=by, harness=harness),
        lambda b: f"Released {what} as {(b.get('release') or {}).get('release_id')}{_swap_ms(b)}.")


def rollback(url: str, token: str | None, scenario: str, release_id: str, expected_parent: str,
             by: str | None) -> Outcome:
    return _run(f"Rolling back to {release_id}", url, token, lambda c: c.rollback(
        scenario, release_id, expected_parent=expected_parent, approved_by=by),
        lambda b: f"Rolled back: {(b.get('release') or {}).get('release_id')} serves {release_id}'s content again.")


def reject(url: str, token: str | None, candidate_id: str, reason: str, by: str | None) -> Outcome:
    return _run(f"Rejecting {candidate_id[:12]}", url, token, lambda c: c.reject(candidate_id, reason, by=by),
                lambda _: f"Rejected {candidate_id[:12]}.")


def start_canary(url: str, token: str | None, scenario: str, candidate_id: str, fraction: float,
                 expected_parent: str | None = None, by: str | None = None) -> Outcome:
    return _run(f"Starting a canary of {candidate_id[:12]}", url, token,
                lambda c: c.start_canary(scenario, candidate_id, fraction, expected_parent, by),
                lambda b: f"Canary of {candidate_id[:12]} started: routing release {b.get('head_release_id')} "
                          f"sends {fraction:.0%} of {scenario}'s requests to it until the rule decides.")


def stop_canary(url: str, token: str | None, scenario: str) -> Outcome:
    return _run("Aborting the canary", url, token, lambda c: c.stop_canary(scenario),
                lambda _: "Canary aborted: a routing release without the split sends all traffic to the head.")
