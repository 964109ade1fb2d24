"""Counters of the server in Prometheus' text format (``GET /metrics``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["Metrics"]


def _labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"' for k, v in labels)
    return "{" + inner + "}"


class Metrics:
    """Request counters kept by the server; engine counters are read from the worker's last stats."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[tuple[str, str], ...]] = Counter()
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.prompt_seconds = 0.0
        self.decode_seconds = 0.0
        self.cancelled = 0

    def request(self, endpoint: str, status: int) -> None:
        self.requests[(("endpoint", endpoint), ("status", str(status)))] += 1

    def completed(self, prompt_tokens: int, generated: int, prompt_ms: float, decode_ms: float) -> None:
        self.prompt_tokens += prompt_tokens
        self.generated_tokens += generated
        self.prompt_seconds += prompt_ms / 1000.0
        self.decode_seconds += decode_ms / 1000.0

    def render(self, *, stats: dict[str, Any] | None, restarts: int, queue_length: int, running: bool,
               ready: bool) -> str:
        out: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[tuple[tuple[str, str], ...], float]]) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")
            for labels, value in samples:
                v = repr(float(value)) if isinstance(value, float) else str(int(value))
                out.append(f"{name}{_labels(labels)} {v}")

        metric("strata_requests_total", "counter", "HTTP requests by endpoint and status code.",
               sorted(self.requests.items()) or [((), 0)])
        metric("strata_requests_cancelled_total", "counter", "Generations stopped because the client went away.",
               [((), self.cancelled)])
        metric("strata_prompt_tokens_total", "counter", "Prompt tokens processed.", [((), self.prompt_tokens)])
        metric("strata_generated_tokens_total", "counter", "Tokens generated.", [((), self.generated_tokens)])
        metric("strata_prompt_seconds_total", "counter", "Seconds spent reading prompts.", [((), self.prompt_seconds)])
        metric("strata_decode_seconds_total", "counter", "Seconds spent generating.", [((), self.decode_seconds)])
        s = stats or {}
        for key, help_ in (("lookups", "Expert lookups in the expert cache."),
                           ("hits", "Expert lookups served from the cache."),
                           ("misses", "Expert lookups not in the cache."),
                           ("swaps", "Experts swapped into the cache by the decode policy."),
                           ("bytes_streamed", "Expert bytes streamed through the prefill ring."),
                           ("halvings", "Prompt chunks halved to fit a loan."),
                           ("refills", "Loans given back to the expert cache.")):
            metric(f"strata_expert_{key}_total" if key in ("lookups", "hits", "misses", "swaps") else f"strata_{key}_total",
                   "counter", help_ + " (since the engine started)", [((), int(s.get(key, 0) or 0))])
        metric("strata_slots_lent", "gauge", "Expert-cache slots on loan to the prompt path now.",
               [((), int(s.get("slots_lent_now", 0) or 0))])
        metric("strata_last_loan_slots", "gauge", "Slots lent for the last prompt.",
               [((), int(s.get("last_loan_slots", 0) or 0))])
        metric("strata_engine_restarts_total", "counter", "Times the engine worker was restarted after exiting.",
               [((), restarts)])
        metric("strata_queue_length", "gauge", "Requests waiting for the engine.", [((), queue_length)])
        metric("strata_requests_running", "gauge", "Requests being served by the engine.", [((), int(running))])
        metric("strata_engine_ready", "gauge", "1 when the engine is loaded and serving.", [((), int(ready))])
        return "\n".join(out) + "\n"
