"""The gateway's FastAPI app: one small router per feature, sharing a `GatewayState`."""

from __future__ import annotations

from fastapi import FastAPI
from starlette.types import ASGIApp

from reef.experience.report_keys import open_report_keys
from reef.gateway.admission import ScenarioAdmission
from reef.gateway.fastpath import ChatFastPath
from reef.gateway.limits import SizeLimits
from reef.gateway.routes import (
    chat,
    demonstrations,
    harness,
    install,
    messages,
    models,
    records,
    releases,
    reports,
    responses,
    status,
)
from reef.gateway.state import GatewayState
from reef.gateway.wire.contract import install_openapi
from reef.gateway.wire.errors import install_error_handlers


def create_app(state: GatewayState) -> FastAPI:
    app = FastAPI(title="Reef gateway", docs_url="/reef/docs", openapi_url="/reef/openapi.json")
    app.state.reef = state
    if state.admission is None:
        state.admission = ScenarioAdmission.seeded(state.config, state.store.stats())
    if state.report_keys is None:
        state.report_keys = open_report_keys(state.store, state.config.state.url)
    limits = state.config.limits
    app.add_middleware(SizeLimits, max_body_bytes=limits.max_body_bytes, max_header_bytes=limits.max_header_bytes)
    install_error_handlers(app)
    install_openapi(app, api_keys=bool(state.config.api_keys))
    for module in (chat, responses, messages, harness, install, models, reports, records, demonstrations, releases,
                   status):
        app.include_router(module.router)
    return app


def create_server_app(state: GatewayState) -> ASGIApp:
    """What uvicorn serves: the FastAPI app, with the chat route's hot path ahead of it."""
    return ChatFastPath(create_app(state), state)
