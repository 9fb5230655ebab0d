"""Prometheus metrics, one registry per app."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kokoro_contract.runtime_metrics import register_runtime


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        register_runtime(self.registry)  # memory, descriptors, threads, asyncio tasks
        self.ttfa = Histogram(
            "gateway_time_to_first_audio_seconds",
            "Request to first audio unit sent, per mode and format",
            ["mode", "format"],
            buckets=(0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 8, 13, 20),
            registry=self.registry,
        )
        self.active = Gauge(
            "gateway_active_sessions",
            "Replies and WebSocket connections in progress",
            ["transport"],
            registry=self.registry,
        )
        self.errors = Counter(
            "gateway_errors_total", "Errors reported to clients", ["code"], registry=self.registry
        )
        self.cancels = Counter(
            "gateway_cancels_total", "Replies cancelled by barge-in", registry=self.registry
        )
        self.refused = Counter(
            "gateway_refused_total",
            "Replies refused up front: overloaded (no model server could serve them in time) or "
            "tts_unavailable (none answers)",
            ["code"],
            registry=self.registry,
        )
        self.admission_wait = Histogram(
            "gateway_admission_wait_seconds",
            "How long new replies waited for a model server with spare time (admitted or not)",
            buckets=(0.01, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3),
            registry=self.registry,
        )
        self.admission_waiting = Gauge(
            "gateway_admission_waiting",
            "New replies waiting now for a model server with spare time",
            registry=self.registry,
        )
        self.retries = Counter(
            "gateway_retries_total",
            "Retries before a reply's first audio, by hop (tts, llm)",
            ["hop"],
            registry=self.registry,
        )
        self.llm_stops = Counter(
            "gateway_llm_stop_reasons_total",
            "LLM answers by why they ended (Bedrock's stopReason: end_turn, max_tokens, ...)",
            ["reason"],
            registry=self.registry,
        )
        self.llm_tokens = Counter(
            "gateway_llm_tokens_total",
            "LLM tokens by kind (inputTokens, outputTokens), as Bedrock reports them",
            ["kind"],
            registry=self.registry,
        )
        self.sessions = Gauge(
            "gateway_open_sessions",
            "Sessions counted against --max-sessions: WebSockets and HTTP replies",
            registry=self.registry,
        )
        self.replies = Counter(
            "gateway_replies_total", "Replies started", ["mode", "format"], registry=self.registry
        )
        self.fleet_up = Gauge(
            "gateway_fleet_up",
            "1 while the fleet's Redis (--redis-url) answers and limits are shared, 0 while this "
            "gateway counts alone (always, without --redis-url)",
            registry=self.registry,
        )
        self.fleet_changes = Counter(
            "gateway_fleet_state_changes_total",
            "The fleet's Redis found down (state=down) or answering again (state=up)",
            ["state"],
            registry=self.registry,
        )
        self.fleet_round_trip = Histogram(
            "gateway_fleet_round_trip_seconds",
            "One call to the fleet's Redis that came back: a session opened, a reply's rates, a "
            "heartbeat",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=self.registry,
        )
