"""Server benchmarks against any OpenAI-compatible URL (strata, llama.cpp's llama-server, vLLM, ...).

Suites:

- ``short``: single chat turns with a short question;
- ``long``: documents per length (4K, 8K and 32K tokens, each capped by the server's context) to
  summarize; document lengths are calibrated in tokens with one unrecorded request first;
- ``agentic``: multi-turn conversations whose context grows by a tool result and the model's own
  reply at every turn (a conversation's turns go one after another; conversations run side by side).

**Load.** Each suite runs at every ``max_concurrency`` (requests in flight at most; None: no limit)
and every ``request_rate`` (requests per second, arriving as a Poisson process: exponential gaps from
a generator seeded by the seed and the load; None: all at once), as vLLM's benchmark does. A request
that arrives while the limit is reached waits for a free place; its latencies count from the moment
it is sent. Requests are sent by httpx's asynchronous client, one connection each.

**The same work at every load.** Every request begins with a fresh random nonce, so that no server can
answer any part of it from a prompt cache; the documents and questions come from a generator seeded by
the seed and the suite step (not by the load), and sampling uses a fixed seed at temperature 0, so two
runs, and two loads of one run, send the same work. Everything that sets the work is in the record's
``work`` (the suite, max tokens, requests, turns, seed, prompt set, the load, the context the
documents were sized for).

**Timing.** Each request is streamed and timed chunk by chunk: TTFT (time to the first generated
text), ITL (gaps between generated chunks), TPOT (decode time per output token after the first),
end-to-end latency. A row reports their mean, p50, p90 and p99, output tokens/s per request (its
samples), and the step's throughput: output tokens and requests per second of wall time.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from strata._sse import sse_data

from ._records import base_record, summarize

__all__ = [
    "PROMPT_SET",
    "SUITES",
    "Load",
    "RequestResult",
    "ServerBenchError",
    "probe_server",
    "run_suites",
    "stream_chat",
]

SUITES = ("short", "long", "agentic")
LONG_LENGTHS = (4096, 8192, 32768)
# the questions, words and conversation scripts below; a change to them or to how they are drawn gets a new name
PROMPT_SET = "chat/2"

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


@dataclass(frozen=True)
class Load:
    """How requests are offered: at most ``max_concurrency`` in flight (None: no limit), arriving at
    ``request_rate`` per second as a Poisson process (None: all at once)."""

    max_concurrency: int | None = 1
    request_rate: float | None = None

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency {self.max_concurrency}: at least 1 request in flight")
        if self.request_rate is not None and not (self.request_rate > 0 and math.isfinite(self.request_rate)):
            raise ValueError(f"--request-rate {self.request_rate}: a rate above 0 (or inf for all at once)")

    def __str__(self) -> str:
        c = "unlimited" if self.max_concurrency is None else str(self.max_concurrency)
        r = "all at once" if self.request_rate is None else f"{self.request_rate:g}/s"
        return f"concurrency {c}, {r}"


@dataclass
class RequestResult:
    ttft_s: float
    e2e_s: float
    chunk_times_s: list[float]  # arrival of each chunk that carried generated text, from the request's start
    output_tokens: int
    prompt_tokens: int | None
    text: str
    timings: dict[str, Any] | None = None
    sent_s: float = 0.0  # when it was sent, from the start of its step
    arrived_s: float = 0.0  # when it arrived (was due), from the start of its step

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
    kind: str = "openai"  # strata, llama.cpp or openai (any other)


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _unreachable(url: str, e: Exception) -> ServerBenchError:
    return ServerBenchError(
        f"cannot reach the server at {url} ({type(e).__name__}: {e}). Is it running? Start one with "
        "`strata serve --model FILE --port PORT`, or check the URL and port given to --url / --target openai:URL"
    )


async def probe_server(
    client: httpx.AsyncClient, url: str, model: str | None = None, max_context: int | None = None
) -> ServerInfo:
    """Ask the server what it serves; fails with a clear message when nothing answers."""
    try:
        r = await client.get("/v1/models")
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
    kind = "strata" if is_strata else "openai"
    ctx = max_context
    if is_strata:
        s = await client.get("/v1/status")
        if s.status_code == 200:
            status = s.json()
            ctx = ctx or status.get("max_context")
    else:
        # llama.cpp's server says its context (-c) in /props; its /v1/models has only the training context
        try:
            p = await client.get("/props")
            props = p.json() if p.status_code == 200 else None
        except (httpx.TransportError, json.JSONDecodeError):
            props = None
        if isinstance(props, dict) and isinstance(props.get("default_generation_settings"), dict):
            kind = "llama.cpp"
            status = {
                "props": {k: props.get(k) for k in ("build_info", "total_slots", "model_path") if k in props}
            }
            ctx = ctx or props["default_generation_settings"].get("n_ctx")
    if ctx is None and data:
        # vLLM says max_model_len; llama.cpp's server gives meta.n_ctx_train
        d0 = data[0]
        ctx = d0.get("max_model_len") or (d0.get("meta") or {}).get("n_ctx_train")
    return ServerInfo(
        url=url,
        model=model,
        strata=is_strata,
        max_context=int(ctx) if ctx else None,
        status=status,
        kind=kind,
    )


async def stream_chat(client: httpx.AsyncClient, url: str, payload: dict[str, Any]) -> RequestResult:
    """One streamed chat completion, timed chunk by chunk."""
    payload = {**payload, "stream": True, "stream_options": {"include_usage": True}}
    chunk_times: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=payload) as r:
            if r.status_code != 200:
                body = (await r.aread()).decode(errors="replace")
                try:
                    msg = json.loads(body)["error"]["message"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    msg = body[:500]
                raise ServerBenchError(f"{url}/v1/chat/completions answered {r.status_code}: {msg}")
            async for data in sse_data(r.aiter_lines()):
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
    """mean, p50 (also as median), p90, p99 and stddev in milliseconds of values in seconds."""
    if not values:
        return {"mean": None, "median": None, "p50": None, "p90": None, "p99": None, "stddev": None, "n": 0}
    a = np.asarray(values, dtype=float) * 1000.0
    p50, p90, p99 = (float(x) for x in np.percentile(a, [50, 90, 99]))
    return {
        "mean": float(a.mean()),
        "median": p50,
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "stddev": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
        "n": int(len(a)),
    }


def _suite_record(
    info: ServerInfo, test: str, results: list[RequestResult], wall_s: float, work: dict[str, Any],
    peak_in_flight: int,
) -> dict[str, Any]:  # fmt: skip
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
        n_gen=work["max_tokens"],
        n_depth=0,
        unit="tok/s",
        repetitions=len(results),
        warmup=work.get("warmup", 0),
        seed=work["seed"],
        model=info.model,
        quant=None,
        server={
            "kind": info.kind,
            "strata": info.strata,
            "max_context": info.max_context,
            "info": status.get("info"),
            "plan": status.get("plan"),
            "props": status.get("props"),
        },
        knobs=status.get("config") or {},
        work=work,
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
            "request_throughput": len(results) / wall_s if wall_s > 0 else None,
            "total_tok_s": (total_out + sum(prompt)) / wall_s if wall_s > 0 else None,
            "wall_s": wall_s,
            "peak_in_flight": peak_in_flight,
        },
        requests=[
            {
                "ttft_ms": r.ttft_s * 1000,
                "e2e_ms": r.e2e_s * 1000,
                "tpot_ms": r.tpot_s * 1000 if r.tpot_s is not None else None,
                "itl_ms": [x * 1000 for x in r.itl_s],
                "output_tokens": r.output_tokens,
                "prompt_tokens": r.prompt_tokens,
                "arrived_ms": r.arrived_s * 1000,
                "sent_ms": r.sent_s * 1000,
            }
            for r in results
        ],
    )


# A job is what arrives at once: one request (short, long) or one conversation (agentic), whose turns are
# sent one after another. It gets a function that sends one request and returns what that request did.
Send = Callable[[list[dict[str, str]], int], Awaitable[RequestResult]]
Job = Callable[[Send], Awaitable[None]]


async def _offer(
    jobs: Sequence[Job], load: Load, seed: int, send_one: Send
) -> tuple[list[RequestResult], float, int]:
    """Offer the jobs at ``load``: (every request's result in the order sent, wall seconds, peak in flight).

    The first error stops the step: the jobs still running are cancelled and the error is raised."""
    n = len(jobs)
    if load.request_rate is None:
        arrivals = np.zeros(n)
    else:
        # Poisson arrivals: exponential gaps of mean 1/rate, the first request at 0
        gaps = np.random.default_rng([seed, 0x5EED, int(load.request_rate * 1000)]).exponential(
            1 / load.request_rate, n
        )
        arrivals = np.concatenate([[0.0], np.cumsum(gaps[:-1])]) if n else gaps
    sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency is not None else None
    results: list[RequestResult] = []
    in_flight = 0
    peak = 0
    t0 = time.perf_counter()

    async def run(job: Job, due: float) -> None:
        nonlocal in_flight, peak
        delay = t0 + due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sem is not None:
            await sem.acquire()
        in_flight += 1
        peak = max(peak, in_flight)
        try:

            async def send(messages: list[dict[str, str]], max_tokens: int) -> RequestResult:
                sent = time.perf_counter() - t0
                res = await send_one(messages, max_tokens)
                res.arrived_s, res.sent_s = due, sent
                results.append(res)
                return res

            await job(send)
        finally:
            in_flight -= 1
            if sem is not None:
                sem.release()

    tasks = [asyncio.ensure_future(run(j, float(a))) for j, a in zip(jobs, arrivals, strict=True)]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    results.sort(key=lambda r: r.sent_s)
    return results, time.perf_counter() - t0, peak


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
    loads: Sequence[Load] = (Load(),),
    advance: Callable[[int], None] | None = None,
    set_total: Callable[[int], None] | None = None,
) -> int:
    """Run the suites against ``url`` at every load; one record per suite step (per document length for
    ``long``) and load. Returns the rows written."""
    for s in suites:
        if s not in SUITES:
            raise ValueError(f"--suite {s!r}: not one of {', '.join(SUITES)}")
    if not loads:
        raise ValueError("no load to run at: give --max-concurrency and --request-rate values")
    return asyncio.run(
        _run_suites(url, suites, on_record, requests=requests, max_tokens=max_tokens, seed=seed, api_key=api_key,
                    model=model, max_context=max_context, turns=turns, timeout=timeout, loads=loads,
                    advance=advance, set_total=set_total)
    )  # fmt: skip


def _count(suite: str, requests: int | None, load: Load) -> int:
    """Requests (short, long: per length) or conversations (agentic) of a suite step at a load: enough for
    every place of the concurrency to be used, twice for short ones."""
    c = load.max_concurrency or 1
    if requests is not None:
        return requests
    return max(8, 2 * c) if suite == "short" else c


async def _run_suites(
    url: str,
    suites: Sequence[str],
    on_record: Callable[[dict[str, Any]], None],
    *,
    requests: int | None,
    max_tokens: int,
    seed: int,
    api_key: str | None,
    model: str | None,
    max_context: int | None,
    turns: int,
    timeout: float,
    loads: Sequence[Load],
    advance: Callable[[int], None] | None,
    set_total: Callable[[int], None] | None,
) -> int:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    base = _base(url)
    most = max((ld.max_concurrency or 0) for ld in loads)
    limits = httpx.Limits(max_connections=None if any(ld.max_concurrency is None for ld in loads) else most + 2,
                          max_keepalive_connections=most + 2)  # fmt: skip
    n_rows = 0
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0), limits=limits
    ) as client:
        info = await probe_server(client, base, model, max_context)
        sampling = {"model": info.model, "temperature": 0.0, "seed": seed}

        async def ask(messages: list[dict[str, str]], max_tok: int) -> RequestResult:
            res = await stream_chat(client, base, {**sampling, "max_tokens": max_tok, "messages": messages})
            if advance:
                advance(1)
            return res

        lengths: list[int] = []
        if "long" in suites:
            cap = (info.max_context - max_tokens - 64) if info.max_context else None
            lengths = sorted({min(n, cap) if cap else n for n in LONG_LENGTHS})
            lengths = [n for n in lengths if n >= 64]
        per_load = {
            "short": lambda ld: _count("short", requests, ld),
            "long": lambda ld: _count("long", requests, ld) * len(lengths),
            "agentic": lambda ld: _count("agentic", requests, ld) * turns,
        }
        if set_total:
            set_total(sum(per_load[s](ld) for s in suites for ld in loads) + (1 if "long" in suites else 0))
        per_word = 1.5
        if "long" in suites:
            # calibrate words -> tokens on this server's own tokenizer (not recorded; also a warm-up)
            probe_words = 400
            cal = await ask(
                [{"role": "user", "content": f"[{_nonce()}] " + _words(np.random.default_rng([seed, 99]), probe_words)}], 1
            )  # fmt: skip
            per_word = (cal.prompt_tokens or probe_words * 1.5) / probe_words

        def work(suite: str, n: int, ld: Load, **more: Any) -> dict[str, Any]:
            return {
                "suite": suite, "max_tokens": max_tokens, "requests": n, "seed": seed, "prompt_set": PROMPT_SET,
                "max_concurrency": ld.max_concurrency, "request_rate": ld.request_rate,
                "max_context": info.max_context, "temperature": 0.0, **more,
            }  # fmt: skip

        for si, suite in enumerate(suites):
            for ld in loads:
                n = _count(suite, requests, ld)
                if suite == "short":
                    rng = np.random.default_rng([seed, si, 0])
                    qs = [_QUESTIONS[int(rng.integers(0, len(_QUESTIONS)))] for _ in range(n)]

                    def short_job(i: int, q: str) -> Job:
                        async def job(send: Send) -> None:
                            await send([
                                {"role": "system", "content": f"[{_nonce()}] You are a concise assistant."},
                                {"role": "user", "content": q if i % 2 else f"{q} Be brief."},
                            ], max_tokens)  # fmt: skip

                        return job

                    jobs = [short_job(i, q) for i, q in enumerate(qs)]
                    results, wall, peak = await _offer(jobs, ld, seed, ask)
                    on_record(_suite_record(info, "short", results, wall, work("short", n, ld), peak))
                    n_rows += 1
                elif suite == "long":
                    for n_tok in lengths:
                        rng = np.random.default_rng([seed, si, n_tok])
                        docs = [_words(rng, max(16, int(n_tok / per_word * 0.97))) for _ in range(n)]

                        def long_job(doc: str) -> Job:
                            async def job(send: Send) -> None:
                                await send([
                                    {"role": "system", "content": f"[{_nonce()}] You summarize documents."},
                                    {"role": "user",
                                     "content": f"Document:\n{doc}\n\nSummarize the document in three sentences."},
                                ], max_tokens)  # fmt: skip

                            return job

                        results, wall, peak = await _offer([long_job(d) for d in docs], ld, seed, ask)
                        rec = _suite_record(info, f"long {n_tok}", results, wall,
                                            work("long", n, ld, document_tokens=n_tok, warmup=1), peak)  # fmt: skip
                        on_record(rec)
                        n_rows += 1
                elif suite == "agentic":
                    rng = np.random.default_rng([seed, si, 0])
                    tool_results = [[_words(rng, 300) for _ in range(turns)] for _ in range(n)]

                    def conversation(results_text: list[str]) -> Job:
                        async def job(send: Send) -> None:
                            history: list[dict[str, str]] = [{
                                "role": "user",
                                "content": "Find which file defines the cache policy and explain it. You may call "
                                "tools by writing `read FILE`; tool results follow as user messages.",
                            }]  # fmt: skip
                            for turn, tool in enumerate(results_text):
                                system = {
                                    "role": "system",
                                    "content": f"[{_nonce()}] You are a coding agent. Be brief.",
                                }
                                res = await send([system, *history], max_tokens)
                                history.append(
                                    {"role": "assistant", "content": res.text or "read src/cache.c"}
                                )
                                history.append(
                                    {"role": "user", "content": f"Tool result (turn {turn + 1}):\n{tool}"}
                                )

                        return job

                    jobs = [conversation(t) for t in tool_results]
                    results, wall, peak = await _offer(jobs, ld, seed, ask)
                    on_record(
                        _suite_record(
                            info, "agentic", results, wall, work("agentic", n, ld, turns=turns), peak
                        )
                    )
                    n_rows += 1
    return n_rows
