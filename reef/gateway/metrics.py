"""Prometheus metrics of the gateway, on a registry of its own (several gateways per process in tests)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


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
        self.durable_wait = Histogram(
            "reef_record_durable_seconds", "Time from response ready to record fsynced",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
            registry=self.registry,
        )
        self.unflushed = Gauge(
            "reef_unflushed_records", "Records durable in the WAL but not yet in parquet", ["scenario"],
            registry=self.registry,
        )
