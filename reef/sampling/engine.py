"""The gate's engine path: sample the eval suite's replies from the running vLLM (its OpenAI server,
not the recording gateway, so gate traffic is never recorded as experience).

A LoRA that does not serve yet is loaded under a temporary adapter name for the gate's duration
and unloaded afterwards, even on error or SIGTERM. Adapter slots are the publisher's first: the
gate uses only slots the engine has free (`max_loras` minus the adapters loaded now), and gates
sharing a data dir take turns (a file lock), so two gates never count the same free slot. A gate
process killed outright leaves its adapter behind under a name carrying its pid; the next gate
unloads adapters whose process is gone.

Each task is one request with `n` = samples, the task's messages and tools as they are, and a
per-task `seed`, so a rerun samples the same replies and both arms share their random numbers. A
task of a scenario with an environment is `samples` episodes, one request per episode and turn.
`reef scenario check` samples through the same session as a client would ask (`as_client`): no
seed, and the server's defaults for top_p, top_k and tool_choice.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import re
import secrets
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from reef.core.chat import ChatError, ChatReply, achat, chat_body
from reef.core.paths import DataDir
from reef.engine.weights import EngineWeights
from reef.sampling.sharing import EngineShare
from reef.scenario.environment import Environment, EpisodeState, reply_text

TEMP_PREFIX = "reef-gate-"
_TEMP_NAME = re.compile(rf"^{TEMP_PREFIX}(\d+)-")
LOCK_FILE = "GATE_ENGINE.LOCK"
T = TypeVar("T")


@dataclass(frozen=True)
class EngineEndpoint:
    """The running engine's OpenAI endpoint (vLLM's own server, never the recording gateway) and
    its base-model name: what the gate, recipes and `reef scenario check` sample through."""

    url: str  # base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is accepted)
    model: str
    # Users first (reef.sampling.sharing): sequences a session keeps in flight while users' calls are,
    # (or `per_user` for each of theirs, when more), and while none is, counted at `users_url` (the
    # gateway's /metrics). None: no yielding (no users to protect), the caller's concurrency.
    beside_users: int | None = None
    per_user: float = 0.0
    alone: int | None = None
    users_url: str | None = None

    @property
    def base_url(self) -> str:
        url = self.url.rstrip("/")
        return url[: -len("/v1")] if url.endswith("/v1") else url


def engine_of(url: str | None, model: str | None) -> EngineEndpoint | None:
    """`--engine-url/--engine-model` as an EngineEndpoint (None when no URL was given)."""
    if url is None:
        return None
    if not model:
        raise ValueError("--engine-url needs --engine-model (the base model's served name)")
    return EngineEndpoint(url, model)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engine-url", default=None,
                        help="the serving vLLM's OpenAI server (not the gateway); unset: transformers samples")
    parser.add_argument("--engine-model", default=None, help="the base model's name on that server")


class GateEngineError(RuntimeError):
    pass


class NoFreeSlotError(GateEngineError):
    """Every adapter slot serves a release or a canary: the gate must not evict one."""


@dataclass(frozen=True)
class Arm:
    """One side of the comparison on the engine: a served model name, or an adapter to load."""

    served: str | None = None  # a name the engine answers already (the base, a serving release)
    adapter: Path | None = None  # loaded under a temporary name when `served` is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class EngineSession:
    """Adapters loaded for one gate run, and the sampling requests."""

    def __init__(self, engine: EngineEndpoint, concurrency: int, timeout_s: float = 600.0) -> None:
        self.engine = engine
        self.weights = EngineWeights(engine.base_url, timeout_s=timeout_s)
        self.http = httpx.AsyncClient(base_url=engine.base_url, timeout=timeout_s, limits=httpx.Limits(
            max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1))  # +1: the share's /metrics
        self.share = EngineShare(self.http, concurrency, engine.beside_users, engine.alone, engine.users_url,
                                 per_user=engine.per_user)
        self.loaded: list[str] = []

    async def _json(self, path: str, **params: Any) -> Any:
        try:
            response = await self.http.get(path, params=params or None)
        except httpx.HTTPError as exc:
            raise GateEngineError(f"engine at {self.engine.base_url}: {exc!r}") from exc
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise GateEngineError(f"GET {path}: HTTP {response.status_code} {response.text[:200]}")
        return response.json()

    async def adapters(self) -> list[str]:
        models = await self._json("/v1/models")
        if models is None:
            raise GateEngineError(f"{self.engine.base_url} has no /v1/models: not an OpenAI server")
        names = [m["id"] for m in models["data"]]
        if self.engine.model not in names:
            raise GateEngineError(f"the engine serves {names}, not the base model {self.engine.model!r}")
        return [m["id"] for m in models["data"] if m.get("parent")]

    async def free_slots(self, loaded: list[str]) -> int | None:
        """Adapter slots nobody uses (None: the engine does not say how many it has)."""
        info = await self._json("/server_info", config_format="json")  # dev mode only
        if info is None:
            return None
        lora = (info.get("vllm_config") or {}).get("lora_config")
        if not isinstance(lora, dict):
            return 0  # started without --enable-lora
        return int(lora.get("max_loras", 1)) - len(loaded)

    async def sweep(self, loaded: list[str]) -> list[str]:
        """Unload temporary adapters whose gate process is gone; the adapters still loaded."""
        kept = []
        for name in loaded:
            match = _TEMP_NAME.match(name)
            if match and not _alive(int(match.group(1))):
                await self.weights.unload_lora(name)
            else:
                kept.append(name)
        return kept

    async def prepare(self, arms: Sequence[Arm]) -> list[str]:
        """The model name each arm is sampled under, loading temporary adapters where needed."""
        loaded = await self.sweep(await self.adapters())
        missing = [a for a in arms if a.served is None or (a.served != self.engine.model and a.served not in loaded)]
        if missing:
            free = await self.free_slots(loaded)
            if free is not None and free < len(missing):
                raise NoFreeSlotError(f"the engine has {max(free, 0)} free adapter slot(s), the gate needs "
                                      f"{len(missing)}")
        names = []
        for arm in arms:
            if arm in missing:
                if arm.adapter is None:
                    raise GateEngineError(f"{arm.served} does not serve on the engine and has no adapter")
                name = f"{TEMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
                self.loaded.append(name)  # before the request: a load that half-happened is undone too
                await self.weights.load_lora(name, arm.adapter)
                names.append(name)
            else:
                assert arm.served is not None
                names.append(arm.served)
        return names

    async def release(self) -> None:
        for name in reversed(self.loaded):
            try:
                await self.weights.unload_lora(name)
            except Exception:  # noqa: BLE001 - the next one must still go; a leftover is swept later
                pass
        self.loaded.clear()
        await self.weights.close()
        await self.http.aclose()

    async def replies(self, model: str, task: dict[str, Any], environment: Environment | None, max_turns: int, *,
                      samples: int, max_tokens: int, temperature: float, seed: int | None,
                      as_client: bool = False) -> list[str]:
        """`samples` replies to a task: episodes when its scenario has an environment, else one request."""
        settings: dict[str, Any] = {"samples": samples, "max_tokens": max_tokens, "temperature": temperature,
                                    "seed": seed, "as_client": as_client}
        if environment is not None:
            return await self.episodes(model, task, environment, max_turns, **settings)
        return await self.sample(model, task, **settings)

    async def sample(self, model: str, task: dict[str, Any], *, samples: int, max_tokens: int, temperature: float,
                     seed: int | None, as_client: bool = False) -> list[str]:
        choices = await self._choices(model, task, task["messages"], samples=samples, max_tokens=max_tokens,
                                      temperature=temperature, seed=seed, as_client=as_client)
        return [reply_text(message) for message in choices]

    async def episodes(self, model: str, task: dict[str, Any], environment: Environment, max_turns: int, *,
                       samples: int, max_tokens: int, temperature: float, seed: int | None,
                       as_client: bool = False) -> list[str]:
        """`samples` episodes of a task with an environment, each its own request per turn (they
        diverge after the first reply); each one's final reply text."""
        states = [EpisodeState(task, environment, max_turns) for _ in range(samples)]

        async def run(k: int, state: EpisodeState) -> None:
            while not state.done:
                turn_seed = None if seed is None else seed + 100_003 * k + 1_009 * state.turns
                message = (await self._choices(model, task, state.messages, samples=1, max_tokens=max_tokens,
                                               temperature=temperature, seed=turn_seed, as_client=as_client))[0]
                await asyncio.to_thread(state.advance, message)  # a tool may block (a real command, a request)

        await asyncio.gather(*(run(k, state) for k, state in enumerate(states)))
        return [state.reply or "" for state in states]

    async def _choices(self, model: str, task: dict[str, Any], messages: list[dict[str, Any]], *, samples: int,
                       max_tokens: int, temperature: float, seed: int | None,
                       as_client: bool) -> list[dict[str, Any]]:
        """`as_client`: the request a client sends (`reef scenario check` measures what users get):
        the server's defaults for top_p, top_k and tool_choice; else the model's own distribution at
        `temperature` (no top-k/top-p) and the task's tool_choice."""
        tools = task.get("tools")
        pinned: dict[str, Any] = {} if as_client else {
            "top_p": 1.0, "top_k": 0, "tool_choice": task.get("tool_choice") if tools else None}
        body = chat_body(model, messages, n=samples, max_tokens=max_tokens, temperature=temperature, seed=seed,
                         tools=tools, **pinned)
        try:
            async with self.share.slot(samples):
                try:
                    reply = await self._chat(body)
                except ChatError as exc:
                    if not (exc.status == 400 and "tool choice" in exc.text and "tool_choice" not in body):
                        raise
                    # An engine without a tool-call parser: the tools are still in the prompt, the reply is text.
                    reply = await self._chat({**body, "tool_choice": "none"})
        except ChatError as exc:
            raise GateEngineError(f"{model} answered {exc.problem or f'HTTP {exc.status}'}: {exc.text[:300]}") from exc
        return reply.messages

    async def _chat(self, body: dict[str, Any]) -> ChatReply:
        try:
            return await achat(self.http, body)
        except httpx.HTTPError as exc:
            raise GateEngineError(f"{body['model']}: {exc!r}") from exc


@contextmanager
def taking_turns(data_dir: Path | None) -> Iterator[None]:
    """Gates sharing a data dir use the engine one at a time (see the module docstring)."""
    if data_dir is None:
        yield
        return
    path = DataDir(data_dir).releases() / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def run_session(engine: EngineEndpoint, concurrency: int, body: Callable[[EngineSession], Awaitable[T]],
                timeout_s: float = 600.0) -> T:
    """Run `body` with a session whose adapters are unloaded afterwards, whatever happens.

    SIGTERM (the learner stopping a round) cancels the body, so its adapters are unloaded before
    the process exits; from a thread that already runs an event loop (a notebook), the session
    runs on a thread of its own."""

    async def main() -> T:
        session = EngineSession(engine, concurrency, timeout_s)
        loop, task = asyncio.get_running_loop(), asyncio.current_task()
        terminated = threading.Event()
        handle_sigterm = threading.current_thread() is threading.main_thread() and task is not None
        if handle_sigterm:
            def on_sigterm() -> None:
                terminated.set()
                task.cancel()  # type: ignore[union-attr]

            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
        try:
            return await body(session)
        except asyncio.CancelledError:
            if terminated.is_set():
                raise SystemExit(128 + signal.SIGTERM) from None
            raise
        finally:
            await session.release()
            if handle_sigterm:
                loop.remove_signal_handler(signal.SIGTERM)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    result: list[T] = []
    error: list[BaseException] = []

    def runner() -> None:
        try:
            result.append(asyncio.run(main()))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=runner, name="reef-gate-engine")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]
