"""Who may call what: data-plane API keys (optional) and the admin token (release operations).

Keys are compared in constant time. With no `api_keys` configured the data plane is open, which is
meant for a gateway bound to loopback; `reef serve` warns when it binds elsewhere without keys.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from reef.config import ApiKey, ServeConfig
from reef.gateway.wire.errors import ReefError


def _bearer(request: Request) -> str | None:
    given = request.headers.get("authorization", "")
    scheme, _, token = given.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    # Anthropic's SDKs (and Claude Code) send the key as `x-api-key`, never as a bearer token.
    return request.headers.get("x-api-key", "").strip() or None


def _matches(token: str, secret: str) -> bool:
    return hmac.compare_digest(token.encode(), secret.encode())


def data_key(config: ServeConfig, request: Request, scenario: str | None) -> ApiKey | None:
    """The caller's key, checked against `scenario` (None: any scenario will do, checked later)."""
    if not config.api_keys:
        return None
    token = _bearer(request)
    if token is None:
        raise ReefError(401, "this server needs an API key: Authorization: Bearer <key>", code="missing_api_key")
    if config.admin_token and _matches(token, config.admin_token):
        return ApiKey(key=token, name="admin")
    found = next((k for k in config.api_keys if _matches(token, k.key)), None)
    if found is None:
        raise ReefError(401, "incorrect API key provided", code="invalid_api_key")
    if scenario is not None:
        allowed(found, scenario)
    return found


def allowed(key: ApiKey | None, scenario: str) -> None:
    if key is not None and key.scenarios is not None and scenario not in key.scenarios:
        raise ReefError(403, f"this API key is not allowed for scenario {scenario!r}", param="x-reef-scenario",
                        code="scenario_not_allowed")


def admin(config: ServeConfig, request: Request) -> None:
    token = config.admin_token
    if not token:
        raise ReefError(403, "admin operations are disabled: set admin_token in serve.yaml or REEF_ADMIN_TOKEN",
                        code="admin_disabled")
    given = _bearer(request)
    if given is None or not _matches(given, token):
        raise ReefError(401, "this operation needs the admin token: Authorization: Bearer <token>",
                        code="invalid_admin_token")
