"""Server benchmarks against any OpenAI-compatible URL (strata, llama.cpp's server, vLLM, ...).

Suites:

- ``short``: single chat turns with a short question;
- ``long``: one document per length (4K, 8K and 32K tokens, each capped by the server's context) to
  summarize; document lengths are calibrated in tokens with one unrecorded request first;
- ``agentic``: a multi-turn conversation whose context grows by a tool result and the model's own
  reply at every turn.

Every request begins with a fresh random nonce, so that no server can answer any part of it from a
prompt cache; the documents and questions come from a seeded generator and sampling uses a fixed
seed at temperature 0, so two runs send the same work. Each request is streamed and timed chunk by
chunk: TTFT (time to the first generated text), ITL (gaps between generated chunks), TPOT (decode time
per output token after the first), end-to-end latency, and output tokens/s.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from ._records import base_record, summarize

__all__ = ["SUITES", "RequestResult", "ServerBenchError", "probe_server", "run_suites", "stream_chat"]

SUITES = ("short", "long", "agentic")
LONG_LENGTHS = (4096, 8192, 32768)

_WORDS = (
    "river stone market engine window garden letter signal harbor winter copper lantern meadow "
    "circuit ladder thunder basket orchard compass glacier velvet saddle beacon canyon falcon mirror "
    "pepper quarry ribbon summit timber violet walnut yellow anchor bridge candle desert feather "
    "harvest island jacket kettle lemon marble needle ocean pillow rocket shadow tunnel umbrella "
    "valley wagon zephyr account balance chapter detail effort figure growth history inquiry journey "
    "knowledge method notice option pattern quality record season theory unit volume weight measure "
    "careful gentle honest quiet rapid simple steady tender urgent vivid narrow broad distant early "
    "carries gathers follows reveals measures records returns settles travels watches builds changes"
).split()

_QUESTIONS = (
    "What is the capital of France, and why did it grow there?",
    "Explain in two sentences how a bicycle stays upright.",
    "Write a haiku about a lighthouse in winter.",
    "List three uses of copper and say which is oldest.",
    "Why is the sky blue? Answer briefly.",
    "Give a one-paragraph summary of how vaccines work.",
    "Suggest a name for a cat that likes boxes, and explain it.",
    "What is the difference between weather and climate?",
)


class ServerBenchError(RuntimeError):
    """The server could not be reached, refused a request, or answered something that is not OpenAI's format."""


@dataclass
class RequestResult:
    ttft_s: float
    e2e_s: float
    chunk_times_s: list[float]  # arrival of each chunk that carried generated text, from the request's start
    output_tokens: int
    prompt_tokens: int | None
    text: str
    timings: dict[str, Any] | None = None

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times_s, self.chunk_times_s[1:], strict=False)]

    @property
    def tpot_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class ServerInfo:
    url: str
    model: str
    strata: bool
    max_context: int | None
    status: dict[str, Any] | None = field(default=None)


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _unreachable(url: str, e: Exception) -> ServerBenchError:
    return ServerBenchError(
        f"cannot reach the server at {url} ({type(e).__name__}: {e}). Is it running? Start one with "
        "`strata serve --model FILE --port PORT`, or check the URL and port given to --target openai:URL"
    )


def probe_server(
    client: httpx.Client, url: str, model: str | None = None, max_context: int | None = None
) -> ServerInfo:
    """Ask the server what it serves; fails with a clear message when nothing answers."""
    try:
        r = client.get("/v1/models")
    except httpx.TransportError as e:
        raise _unreachable(url, e) from None
    if r.status_code == 401:
        raise ServerBenchError(f"{url} wants an API key (401): pass --api-key KEY")
    if r.status_code != 200:
        raise ServerBenchError(f"{url}/v1/models answered {r.status_code}: {r.text[:300]}")
    try:
        data = r.json().get("data") or []
    except (json.JSONDecodeError, AttributeError):
        raise ServerBenchError(f"{url}/v1/models did not answer OpenAI's JSON: {r.text[:300]}") from None
    if model is None:
        if not data:
            raise ServerBenchError(f"{url} serves no model (/v1/models is empty); pass --server-model NAME")
        model = str(data[0].get("id"))
    is_strata = r.headers.get("x-strata-server") == "1"
    status = None
    ctx = max_context
    if is_strata:
        s = client.get("/v1/status")
        if s.status_code == 200:
            status = s.json()
            ctx = ctx or status.get("max_context")
    if ctx is None and data:
        # vLLM says max_model_len; llama.cpp's server gives meta.n_ctx_train
        d0 = data[0]
        ctx = d0.get("max_model_len") or (d0.get("meta") or {}).get("n_ctx_train")
    return ServerInfo(
        url=url, model=model, strata=is_strata, max_context=int(ctx) if ctx else None, status=status
    )


def stream_chat(client: httpx.Client, url: str, payload: dict[str, Any]) -> RequestResult:
    """One streamed chat completion, timed chunk by chunk."""
    payload = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    chunk_times: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    t0 = time.perf_counter()
    try:
        with client.stream("POST", "/v1/chat/completions", json=payload) as r:
            if r.status_code != 200:
                body = r.read().decode(errors="replace")
                try:
                    msg = json.loads(body)["error"]["message"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    msg = body[:500]
                raise ServerBenchError(f"{url}/v1/chat/completions answered {r.status_code}: {msg}")
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter() - t0
                try:
                    chunk = json.loads(data)
                except json.JSONDecodeError:
                    raise ServerBenchError(f"{url} streamed a chunk that is not JSON: {data[:200]}") from None
                if chunk.get("error"):
                    raise ServerBenchError(
                        f"{url} failed mid-stream: {chunk['error'].get('message', chunk['error'])}"
                    )
                for choice in chunk.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
                    if piece:
                        chunk_times.append(now)
                        text.append(piece)
                usage = chunk.get("usage") or usage
                timings = chunk.get("timings") or timings
    except httpx.TransportError as e:
        raise _unreachable(url, e) from None
    e2e = time.perf_counter() - t0
    if usage and usage.get("completion_tokens") is not None:
        n_out = int(usage["completion_tokens"])
    elif timings and timings.get("predicted_n") is not None:
        n_out = int(timings["predicted_n"])
    else:
        n_out = len(chunk_times)  # one token per chunk is what streaming servers send
    prompt_tokens = int(usage["prompt_tokens"]) if usage and usage.get("prompt_tokens") is not None else None
    return RequestResult(
        ttft_s=chunk_times[0] if chunk_times else e2e,
        e2e_s=e2e,
        chunk_times_s=chunk_times,
        output_tokens=n_out,
        prompt_tokens=prompt_tokens,
        text="".join(text),
        timings=timings,
    )


def _nonce() -> str:
    # fresh for every request and every run: a prompt cache can never match the start of a prompt
    return uuid.uuid4().hex


def _words(rng: np.random.Generator, n: int) -> str:
    idx = rng.integers(0, len(_WORDS), n)
    out, line = [], []
    for i, j in enumerate(idx):
        line.append(_WORDS[j])
        if i % 12 == 11:
            out.append(" ".join(line) + ".")
            line = []
    if line:
        out.append(" ".join(line) + ".")
    return " ".join(out)


def _pct(values: Sequence[float]) -> dict[str, Any]:
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None, "stddev": None, "n": 0}
    a = np.asarray(values, dtype=float) * 1000.0
    return {
        "mean": float(a.mean()),
        "median": float(np.median(a)),
        "p90": float(np.percentile(a, 90)),
        "p99": float(np.percentile(a, 99)),
        "stddev": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "n": int(len(a)),
    }


def _suite_record(
    info: ServerInfo, test: str, results: list[RequestResult], wall_s: float, params: dict[str, Any]
) -> dict[str, Any]:
    tps = [r.output_tokens / r.e2e_s for r in results if r.e2e_s > 0]
    itl = [x for r in results for x in r.itl_s]
    tpot = [t for r in results if (t := r.tpot_s) is not None]
    total_out = sum(r.output_tokens for r in results)
    prompt = [r.prompt_tokens for r in results if r.prompt_tokens is not None]
    status = info.status or {}
    return base_record(
        target="openai",
        url=info.url,
        test=test,
        kind="server",
        n_prompt=int(round(sum(prompt) / len(prompt))) if prompt else None,
        n_gen=params["max_tokens"],
        n_depth=0,
        unit="tok/s",
        repetitions=len(results),
        warmup=params.get("warmup", 0),
        seed=params["seed"],
        model=info.model,
        quant=None,
        server={
            "strata": info.strata,
            "max_context": info.max_context,
            "info": status.get("info"),
            "plan": status.get("plan"),
        },
        knobs=status.get("config") or {},
        samples=tps,
        **summarize(tps),
        metrics={
            "requests": len(results),
            "ttft_ms": _pct([r.ttft_s for r in results]),
            "tpot_ms": _pct(tpot),
            "itl_ms": _pct(itl),
            "e2e_ms": _pct([r.e2e_s for r in results]),
            "output_tokens": total_out,
            "prompt_tokens": prompt,
            "throughput_tok_s": total_out / wall_s if wall_s > 0 else None,
            "wall_s": wall_s,
        },
        requests=[
            {
                "ttft_ms": r.ttft_s * 1000,
                "e2e_ms": r.e2e_s * 1000,
                "output_tokens": r.output_tokens,
                "prompt_tokens": r.prompt_tokens,
            }
            for r in results
        ],
    )


def run_suites(
    url: str,
    suites: Sequence[str],
    on_record: Callable[[dict[str, Any]], None],
    *,
    requests: int | None = None,
    max_tokens: int = 64,
    seed: int = 0,
    api_key: str | None = None,
    model: str | None = None,
    max_context: int | None = None,
    turns: int = 6,
    timeout: float = 900.0,
    advance: Callable[[int], None] | None = None,
    set_total: Callable[[int], None] | None = None,
) -> int:
    """Run the suites against ``url``; one record per suite (per document length for ``long``). Returns rows written."""
    for s in suites:
        if s not in SUITES:
            raise ValueError(f"--suite {s!r}: not one of {', '.join(SUITES)}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = _base(url)
    rng = np.random.default_rng(seed)
    n_rows = 0
    with httpx.Client(base_url=base, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)) as client:
        info = probe_server(client, base, model, max_context)
        sampling = {"model": info.model, "temperature": 0.0, "seed": seed, "max_tokens": max_tokens}
        params = {"max_tokens": max_tokens, "seed": seed}

        def ask(messages: list[dict[str, str]], max_tok: int = max_tokens) -> RequestResult:
            res = stream_chat(client, base, {**sampling, "max_tokens": max_tok, "messages": messages})
            if advance:
                advance(1)
            return res

        lengths: list[int] = []
        if "long" in suites:
            cap = (info.max_context - max_tokens - 64) if info.max_context else None
            lengths = sorted({min(n, cap) if cap else n for n in LONG_LENGTHS})
            lengths = [n for n in lengths if n >= 64]
        counts = {
            "short": requests or 8,
            "long": (requests or 1) * len(lengths) + 1,
            "agentic": (requests or 1) * turns,
        }
        if set_total:
            set_total(sum(counts[s] for s in suites))

        for suite in suites:
            if suite == "short":
                results, t0 = [], time.perf_counter()
                for i in range(counts["short"]):
                    q = _QUESTIONS[int(rng.integers(0, len(_QUESTIONS)))]
                    results.append(
                        ask(
                            [
                                {"role": "system", "content": f"[{_nonce()}] You are a concise assistant."},
                                {"role": "user", "content": q if i % 2 else f"{q} Be brief."},
                            ]
                        )
                    )
                on_record(_suite_record(info, "short", results, time.perf_counter() - t0, params))
                n_rows += 1
            elif suite == "long":
                # calibrate words -> tokens on this server's own tokenizer (not recorded; also a warm-up)
                probe_words = 400
                cal = ask([{"role": "user", "content": f"[{_nonce()}] " + _words(rng, probe_words)}], 1)
                per_word = (cal.prompt_tokens or probe_words * 1.5) / probe_words
                for n_tok in lengths:
                    results, t0 = [], time.perf_counter()
                    for _ in range(requests or 1):
                        doc = _words(rng, max(16, int(n_tok / per_word * 0.97)))
                        results.append(
                            ask(
                                [
                                    {"role": "system", "content": f"[{_nonce()}] You summarize documents."},
                                    {
                                        "role": "user",
                                        "content": f"Document:\n{doc}\n\nSummarize the document in three sentences.",
                                    },
                                ]
                            )
                        )
                    rec = _suite_record(
                        info, f"long {n_tok}", results, time.perf_counter() - t0, {**params, "warmup": 1}
                    )
                    on_record(rec)
                    n_rows += 1
            elif suite == "agentic":
                results, t0 = [], time.perf_counter()
                for _ in range(requests or 1):
                    history: list[dict[str, str]] = [
                        {
                            "role": "user",
                            "content": "Find which file defines the cache policy and explain it. You may call "
                            "tools by writing `read FILE`; tool results follow as user messages.",
                        }
                    ]
                    for turn in range(turns):
                        system = {
                            "role": "system",
                            "content": f"[{_nonce()}] You are a coding agent. Be brief.",
                        }
                        res = ask([system, *history])
                        results.append(res)
                        history.append({"role": "assistant", "content": res.text or "read src/cache.c"})
                        history.append(
                            {
                                "role": "user",
                                "content": f"Tool result (turn {turn + 1}):\n" + _words(rng, 300),
                            }
                        )
                on_record(_suite_record(info, "agentic", results, time.perf_counter() - t0, params))
                n_rows += 1
    return n_rows
