"""The server's counters for ``GET /metrics``, in Prometheus' text format by ``prometheus-client``.

The server counts requests and tokens itself (``Metrics``); the engine's counters are the worker's
last stats, read when the page is scraped. Each server has a registry of its own.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE", "EngineView", "Metrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

# engine counters: (key in the worker's stats, metric name without _total, help)
_ENGINE_COUNTERS = (
    ("lookups", "strata_expert_lookups", "Expert lookups in the expert cache (since the engine started)."),
    ("hits", "strata_expert_hits", "Expert lookups served from the cache (since the engine started)."),
    ("misses", "strata_expert_misses", "Expert lookups not in the cache (since the engine started)."),
    (
        "swaps",
        "strata_expert_swaps",
        "Experts swapped into the cache by the decode policy (since the engine started).",
    ),
    (
        "bytes_streamed",
        "strata_bytes_streamed",
        "Expert bytes streamed through the prefill ring (since the engine started).",
    ),
    ("halvings", "strata_halvings", "Prompt chunks halved to fit a loan (since the engine started)."),
    ("refills", "strata_refills", "Loans given back to the expert cache (since the engine started)."),
)


@dataclass
class EngineView:
    """What the supervisor knows at the time of a scrape."""

    stats: dict[str, Any] | None
    restarts: int
    queue_length: int
    running: int  # requests the engine runs now (up to --parallel)
    ready: bool


class Metrics:
    """Request counters kept by the server, and the collector that renders them with the engine's."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str]] = Counter()  # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.prompt_seconds = 0.0
        self.decode_seconds = 0.0
        self.cancelled = 0

    def request(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, str(status))] += 1

    def completed(self, prompt_tokens: int, generated: int, prompt_ms: float, decode_ms: float) -> None:
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += generated
        self.prompt_seconds += prompt_ms / 1000.0
        self.decode_seconds += decode_ms / 1000.0

    def registry(self, engine: Callable[[], EngineView]) -> CollectorRegistry:
        """A registry whose one collector reads these counters and ``engine()`` at each scrape."""
        reg = CollectorRegistry(auto_describe=False)
        reg.register(_Collector(self, engine))  # type: ignore[arg-type]
        return reg

    @staticmethod
    def render(registry: CollectorRegistry) -> bytes:
        return generate_latest(registry)


class _Collector:
    def __init__(self, m: Metrics, engine: Callable[[], EngineView]) -> None:
        self.m = m
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        m = self.m
        req = CounterMetricFamily(
            "strata_requests", "HTTP requests by endpoint and status code.", labels=["endpoint", "status"]
        )
        for (endpoint, status), n in sorted(m.requests.items()):
            req.add_metric([endpoint, status], n)
        yield req
        for name, help_, value in (
            ("strata_requests_cancelled", "Generations stopped because the client went away.", m.cancelled),
            ("strata_prompt_tokens", "Prompt tokens processed.", m.prompt_tokens),
            ("strata_generated_tokens", "Tokens generated.", m.generated_tokens),
            ("strata_prompt_seconds", "Seconds spent reading prompts.", m.prompt_seconds),
            ("strata_decode_seconds", "Seconds spent generating.", m.decode_seconds),
        ):
            yield CounterMetricFamily(name, help_, value=value)
        e = self.engine()
        s = e.stats or {}
        for key, name, help_ in _ENGINE_COUNTERS:
            yield CounterMetricFamily(name, help_, value=int(s.get(key, 0) or 0))
        yield GaugeMetricFamily(
            "strata_slots_lent",
            "Expert-cache slots on loan to the prompt path now.",
            value=int(s.get("slots_lent_now", 0) or 0),
        )
        yield GaugeMetricFamily(
            "strata_last_loan_slots",
            "Slots lent for the last prompt.",
            value=int(s.get("last_loan_slots", 0) or 0),
        )
        yield CounterMetricFamily(
            "strata_engine_restarts", "Times the engine worker was restarted after exiting.", value=e.restarts
        )
        yield GaugeMetricFamily(
            "strata_queue_length", "Requests waiting for the engine.", value=e.queue_length
        )
        yield GaugeMetricFamily(
            "strata_requests_running", "Requests being served by the engine.", value=int(e.running)
        )
        yield GaugeMetricFamily(
            "strata_engine_ready", "1 when the engine is loaded and serving.", value=int(e.ready)
        )
