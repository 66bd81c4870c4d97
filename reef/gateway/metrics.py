"""Prometheus metrics of the gateway, on a registry of its own (several gateways per process in tests)."""

from __future__ import annotations

from typing import Any, NamedTuple

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ChatMetrics(NamedTuple):
    """One scenario's children of the metrics every chat call updates."""

    ok: Any  # reef_chat_requests{status="200"}
    records: Any
    latency: Any


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "reef_chat_requests", "Chat completion requests", ["scenario", "status"], registry=self.registry
        )
        self.records = Counter("reef_records", "Records made durable", ["scenario"], registry=self.registry)
        self.reports = Counter("reef_reports", "Reports stored", ["scenario"], registry=self.registry)
        self.latency = Histogram(
            "reef_request_latency_seconds", "End-to-end chat latency through the gateway", ["scenario"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self._chat: dict[str, ChatMetrics] = {}
        self.durable_wait = Histogram(
            "reef_record_durable_seconds", "Time from response ready to record fsynced",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.unflushed = Gauge(
            "reef_unflushed_records", "Records durable in the WAL but not yet in parquet", ["scenario"],
            registry=self.registry,
        )
        # Read by the learner's rounds, which hold their own engine requests back while users wait
        # (reef.sampling.sharing); set when scraped, so a call costs nothing more.
        self.in_flight = Gauge("reef_requests_in_flight", "Client calls being served now", registry=self.registry)
        # Each upstream replica (reef.gateway.transport.replicas), set from its counts when scraped.
        self.replica_healthy = Gauge("reef_replica_healthy", "1 while the upstream replica takes calls", ["replica"],
                                     registry=self.registry)
        self.replica_requests = Gauge("reef_replica_requests", "Calls sent to the upstream replica", ["replica"],
                                      registry=self.registry)
        self.replica_failures = Gauge("reef_replica_failures", "Calls the upstream replica failed (no connection, "
                                      "dropped, 502/503/504, a stream cut)", ["replica"], registry=self.registry)

    def replicas(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.replica_healthy.labels(row["url"]).set(1 if row["healthy"] else 0)
            self.replica_requests.labels(row["url"]).set(row["requests"])
            self.replica_failures.labels(row["url"]).set(row["failures"])

    def chat(self, scenario: str) -> ChatMetrics:
        """Bound once per scenario (admission caps how many there are): `labels()` takes a lock and
        builds a key on every call, three times per chat call."""
        bound = self._chat.get(scenario)
        if bound is None:
            bound = self._chat[scenario] = ChatMetrics(
                self.requests.labels(scenario, "200"), self.records.labels(scenario), self.latency.labels(scenario)
            )
        return bound
