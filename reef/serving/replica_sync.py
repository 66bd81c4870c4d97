"""Bring one replica in step with what the others serve, before it takes calls again.

A replica that was out (killed and restarted, partitioned, or taken out because a weight reload
failed on it) holds what it held, or, restarted, the base weights and no adapter. Health alone
would send it calls for adapters it lacks, or answer them with other weights than the records
would name. So when its `/health` answers again (reef.gateway.transport.replicas), under the
publisher's lock (no release moves meanwhile), it gets:

1. the full weights every replica holds (reloaded when they are not the base; the base checked
   by its probe, and reloaded when it does not answer as the base);
2. every adapter the publisher keeps loaded (heads, previous releases, canary arms), under the
   same names: loading a name it already holds counts;
3. a canary request for each scenario's head and canary arm, on it alone, as a release proves
   them (reef.serving.swap.Swapper.verify).

Only then is it back in service. A failure leaves it out; the next probe tries again.
"""

from __future__ import annotations

import asyncio
import logging

from reef.engine.replica_weights import ReplicaWeights, label
from reef.engine.weights import EngineWeightsError
from reef.registry.artifacts import ArtifactError
from reef.registry.chain_api import ReleaseError
from reef.serving.publisher import Publisher

log = logging.getLogger("reef.registry")


async def sync_replica(publisher: Publisher, url: str) -> bool:
    """True once the replica at `url` serves what the chains name; False: it stays out for now."""
    swapper, slots, weights = publisher.swapper, publisher.slots, publisher.weights
    if publisher.disabled or swapper is None or slots is None or not isinstance(weights, ReplicaWeights):
        return True  # no releases load weights here: every replica serves the base it started with
    if publisher.base_content is None:
        return False  # start-up has not reached the releases yet
    one = weights.one(url)
    store, model = publisher.store, publisher.config.model_name
    async with publisher.lock:
        try:
            full = swapper.engine_full or publisher.base_content
            if full != publisher.base_content:
                await one.reload_full(await asyncio.to_thread(store.verify, full))
            else:
                try:
                    await swapper.verify(model, full, None, one)
                except ReleaseError:
                    await one.reload_full(await asyncio.to_thread(store.verify, full))
            for content_id, name in list(slots.loaded.items()):
                await one.load_lora(name, await asyncio.to_thread(store.verify, content_id))
            for route in publisher.routes.serving().values():
                if route.content_id is not None:
                    await swapper.verify(route.model, route.content_id, swapper.probe_for(route.content_id), one)
                if route.canary is not None:
                    arm = route.canary.candidate_id
                    await swapper.verify(route.canary.model, arm, swapper.probe_for(arm), one)
        except (ReleaseError, ArtifactError, EngineWeightsError) as exc:
            log.warning("replica %s stays out: it could not be brought in step with the releases (%s)",
                        label(url), exc)
            return False
    log.info("replica %s is in step with every release: it takes calls again", label(url))
    return True
