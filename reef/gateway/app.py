"""The gateway's FastAPI app: one small router per feature, sharing a `GatewayState`."""

from __future__ import annotations

from fastapi import FastAPI

from reef.gateway import chat, models, records, releases, reports, status
from reef.gateway.errors import install_error_handlers
from reef.gateway.state import GatewayState


def create_app(state: GatewayState) -> FastAPI:
    app = FastAPI(title="Reef gateway", docs_url="/reef/docs", openapi_url="/reef/openapi.json")
    app.state.reef = state
    install_error_handlers(app)
    for module in (chat, models, reports, records, releases, status):
        app.include_router(module.router)
    return app
