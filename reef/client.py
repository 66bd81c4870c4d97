"""`ReefClient`: the release API of a running `reef serve` (docs/release-api.md), for the CLI,
the dashboard and notebooks. Chat traffic goes through any OpenAI client instead."""

from __future__ import annotations

import os
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8900"


class ReefAPIError(RuntimeError):
    def __init__(self, status: int, code: str | None, message: str) -> None:
        self.status, self.code, self.message = status, code, message
        super().__init__(f"HTTP {status} {code or ''}: {message}".replace("  ", " "))


class HeadMovedError(ReefAPIError):
    """Someone released first: nothing changed; reload the head and decide again."""


class ReefClient:
    def __init__(self, url: str | None = None, admin_token: str | None = None, timeout_s: float = 600.0) -> None:
        self.url = (url or os.environ.get("REEF_URL") or DEFAULT_URL).rstrip("/")
        token = admin_token if admin_token is not None else os.environ.get("REEF_ADMIN_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> ReefClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        response = self.http.request(method, path, **kw)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                code, message = error.get("code"), error.get("message", response.text)
            except (ValueError, KeyError, TypeError):
                code, message = None, response.text
            cls = HeadMovedError if code == "head_moved" else ReefAPIError
            raise cls(response.status_code, code, message)
        return response.json()

    # --- reading ------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/reef/status")

    def releases(self, scenario: str) -> dict[str, Any]:
        return self._call("GET", f"/reef/scenarios/{scenario}/releases")

    def head(self, scenario: str) -> str | None:
        head = self.releases(scenario)["head"]
        return head["release_id"] if head else None

    def candidates(self, scenario: str | None = None) -> list[dict[str, Any]]:
        params = {"scenario": scenario} if scenario else None
        return self._call("GET", "/reef/candidates", params=params)["candidates"]

    def candidate(self, candidate_id: str) -> dict[str, Any]:
        return self._call("GET", f"/reef/candidates/{candidate_id}")

    # --- admin --------------------------------------------------------------------------------

    def release(self, scenario: str, candidate: str, expected_parent: str,
                approved_by: str | None = None, harness: str | None = None) -> dict[str, Any]:
        """Release a candidate; `harness` (a harness candidate) binds it to weights in one composite release."""
        body = {"candidate": candidate, "expected_parent": expected_parent, "approved_by": approved_by}
        if harness is not None:
            body["harness"] = harness
        return self._call("POST", f"/reef/scenarios/{scenario}/releases", json=body)

    def rollback(self, scenario: str, release_id: str, expected_parent: str,
                 approved_by: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/reef/scenarios/{scenario}/rollback", json={
            "release_id": release_id, "expected_parent": expected_parent, "approved_by": approved_by})

    def reject(self, candidate_id: str, reason: str, by: str | None = None) -> dict[str, Any]:
        return self._call("POST", f"/reef/candidates/{candidate_id}/reject", json={"reason": reason, "by": by})

    def start_canary(self, scenario: str, candidate: str, fraction: float | None = None,
                     expected_parent: str | None = None, approved_by: str | None = None) -> dict[str, Any]:
        """A routing release on top of `expected_parent` (None: the head) sends `fraction` of the
        traffic to `candidate`; returns the canary (its `head_release_id` is that release)."""
        body = {"candidate": candidate, "fraction": fraction}
        body |= {k: v for k, v in (("expected_parent", expected_parent), ("approved_by", approved_by)) if v}
        return self._call("POST", f"/reef/scenarios/{scenario}/canary", json=body)

    def stop_canary(self, scenario: str) -> dict[str, Any]:
        return self._call("DELETE", f"/reef/scenarios/{scenario}/canary")

    def canary(self, scenario: str) -> dict[str, Any]:
        return self._call("GET", f"/reef/scenarios/{scenario}/canary")
