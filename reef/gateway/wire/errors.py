"""OpenAI-style error bodies for every failure a client can see; never a traceback."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from reef.experience.wal import WalError, WalFullError

log = logging.getLogger("reef.gateway")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    507: "insufficient_storage",
}


class ReefError(Exception):
    """Raised anywhere in a handler to answer with an OpenAI-style error."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error"),
            "param": param,
            "code": code,
        }
    }


def error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(error_body(status, message, param, code), status_code=status, headers=headers)


def from_validation(problems: Sequence[Any], status: int) -> ReefError:
    """pydantic's errors as one client error naming the field, the deepest first: a missing `text`
    of a content part says more than "content is not a string"."""
    first = max(problems, key=lambda e: len(_field_path(e.get("loc", ()))))
    param = ".".join(_field_path(first.get("loc", ()))) or None
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return ReefError(status, message, param=param, code="invalid_value")


def _field_path(loc: tuple[Any, ...]) -> list[str]:
    """pydantic's error location without its union labels: the path a client would write."""
    out: list[str] = []
    after_index = False
    for part in loc:
        if part == "body":
            continue
        # Union branches are named by type ("str", "list[TextPart]", "NamedToolChoice"); a
        # discriminated branch by its tag, right after the list index ("messages.0.tool").
        if isinstance(part, str) and (part[:1].isupper() or any(c in part for c in "[]',")
                                      or part in {"str", "int", "float", "bool", "none"}
                                      or (after_index and out[-2:-1] in (["messages"], ["content"])
                                          and part in _TAGS)):
            after_index = False
            continue
        after_index = isinstance(part, int)
        out.append(str(part))
    return out


_TAGS = {"system", "developer", "user", "assistant", "tool", "function", "text", "image_url", "input_audio",
         "file", "refusal"}


def _allowed(request: Request) -> list[str]:
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def reef_error_response(exc: ReefError) -> JSONResponse:
    return error_response(exc.status, exc.message, exc.param, exc.code, exc.headers)


def store_error_response(exc: WalError) -> JSONResponse:
    # Nothing of this request was acknowledged: the client may retry it as it is.
    if isinstance(exc, WalFullError):
        return error_response(507, "the disk holding Reef's write-ahead log is full; nothing of this "
                              "request was stored", code="storage_full", headers={"Retry-After": "30"})
    return error_response(503, "Reef's write-ahead log is unavailable; nothing of this request was stored",
                          code="store_unavailable")


def unexpected_error_response(method: str, path: str) -> JSONResponse:
    """Call from an `except` block: the traceback goes to the log, never to the client."""
    log.exception("unhandled error on %s %s", method, path)
    return error_response(500, "internal error in the Reef gateway; see the server log")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ReefError)
    async def _reef(_: Request, exc: ReefError) -> JSONResponse:
        return reef_error_response(exc)

    @app.exception_handler(WalError)
    async def _store(_: Request, exc: WalError) -> JSONResponse:
        return store_error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        err = from_validation(exc.errors(), 422)
        return error_response(422, err.message, param=err.param, code=err.code)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names only the first route that matched the path; a path may have several.
            headers["Allow"] = ", ".join(_allowed(request))
        response = error_response(exc.status_code, str(exc.detail))
        response.headers.update(headers)
        return response

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        return unexpected_error_response(request.method, request.url.path)
