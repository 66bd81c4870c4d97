"""What the gateway's routers share; each router takes only what it uses from here."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from reef.config import ServeConfig
from reef.engine.hold import EngineHold
from reef.gateway.inflight import InFlight
from reef.gateway.metrics import GatewayMetrics
from reef.gateway.sessions import SessionIndex
from reef.gateway.transport.replicas import Replicas
from reef.serving.canary import Canaries
from reef.serving.routing import Routes

if TYPE_CHECKING:
    from reef.engine.fleet import EngineFleet
    from reef.engine.supervisor import EngineSupervisor
    from reef.experience.report_keys import ReportKeys
    from reef.experience.store import ExperienceStore
    from reef.gateway.admission import ScenarioAdmission
    from reef.learn.learner import Learner
    from reef.serving.publisher import Publisher


@dataclass
class GatewayState:
    config: ServeConfig
    store: ExperienceStore
    upstream: Replicas
    routes: Routes
    engine: EngineSupervisor | EngineFleet | None = None  # the fleet: engine.replicas > 1
    learner: Learner | None = None
    publisher: Publisher | None = None
    admission: ScenarioAdmission | None = None  # set by create_app
    hold: EngineHold = field(default_factory=EngineHold)
    canaries: Canaries = field(default_factory=Canaries)
    sessions: SessionIndex = field(default_factory=SessionIndex)
    inflight: InFlight = field(default_factory=InFlight)
    # Reports' idempotency keys: this store's, or PostgreSQL's with state.url (set by create_app).
    report_keys: ReportKeys | None = None
    metrics: GatewayMetrics = field(default_factory=GatewayMetrics)
    started_at: float = field(default_factory=time.time)
    # Requests refused because their prompt does not fit the model's context, by dialect: never
    # truncated, never recorded as experience, counted here for `GET /reef/status`.
    context_refused: dict[str, int] = field(default_factory=dict)


def get_state(request: Request) -> GatewayState:
    return request.app.state.reef
