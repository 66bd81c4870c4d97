"""Health, status and Prometheus metrics."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from reef.core.pg import state_url
from reef.gateway.state import get_state
from reef.gateway.wire.contract import errors

router = APIRouter()
_HEALTH = {"type": "object", "properties": {"status": {"type": "string"}}, "required": ["status"]}


@router.get("/healthz", responses={503: {"description": "the model server is down",
                                         "content": {"application/json": {"schema": _HEALTH}}}, **errors()})
async def healthz(request: Request) -> JSONResponse:
    st = get_state(request)
    if st.engine is not None and not st.engine.ready:  # restarting, or its releases not applied again yet
        return JSONResponse({"status": "engine_restarting"}, status_code=503,
                            headers={"Retry-After": str(st.engine.retry_after_s())})
    engine_ok = await st.upstream.healthy()
    status = 200 if engine_ok else 503
    return JSONResponse({"status": "ok" if engine_ok else "engine_unhealthy"}, status_code=status)


@router.get("/reef/status", responses=errors())
async def status(request: Request) -> dict[str, Any]:
    st = get_state(request)
    stats = st.store.stats()
    serving = st.routes.serving()
    scenarios: dict[str, Any] = {}
    for name in sorted(set(stats) | set(serving)):
        s = stats.get(name)
        route = serving.get(name) or st.routes.for_scenario(name)
        scenarios[name] = {
            "records": s.records if s else 0,
            "reports": s.reports if s else 0,
            "unflushed_records": s.unflushed_records if s else 0,
            "unflushed_reports": s.unflushed_reports if s else 0,
            "flush_lag_s": s.oldest_unflushed_age_s if s else 0.0,
            "serving_release": route.release_id,
            "serving_model": route.model,
        }
        if st.publisher is not None and not st.publisher.disabled:
            scenarios[name]["serving"] = st.publisher.serving(name)
        st.metrics.unflushed.labels(name).set(scenarios[name]["unflushed_records"])
    engine: dict[str, Any] = st.engine.describe() if st.engine else {"managed": False}
    engine.update({"url": st.upstream.base_url, "healthy": await st.upstream.healthy(),
                   "replicas": st.upstream.describe(), "cut_streams": st.upstream.cut_streams})
    return {
        "uptime_s": round(time.time() - st.started_at, 3),
        "model": st.config.model_name,
        "in_flight": len(st.inflight),
        "partition": st.store.partition,  # the experience partition this gateway writes (store.partition)
        "engine": engine,
        "learner": st.learner.describe() if st.learner else {"enabled": False},
        "scenarios": scenarios,
        # Where what gateways share lives (chains, reports' keys, the ledger): `state.url`'s
        # PostgreSQL, or files under data_dir. The URL itself may hold a password: not shown.
        "state": {"backend": "postgresql" if state_url(st.config.state.url) else "files"},
        "context_refused": dict(sorted(st.context_refused.items())),
    }


@router.get("/metrics", response_class=Response, responses={
    200: {"content": {CONTENT_TYPE_LATEST: {"schema": {"type": "string"}}}}, **errors()})
async def metrics(request: Request) -> Response:
    st = get_state(request)
    for name, s in st.store.stats().items():
        st.metrics.unflushed.labels(name).set(s.unflushed_records)
    st.metrics.in_flight.set(len(st.inflight))
    st.metrics.replicas(st.upstream.describe())
    return Response(generate_latest(st.metrics.registry), media_type=CONTENT_TYPE_LATEST)
