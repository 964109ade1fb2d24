"""One cell: start fresh engines through the server, send the prompts, record everything.

For each of the cell's starts a new ``strata serve --model M <engine flags> --port 0`` is started (the
server's worker opens the engine; a native crash ends the worker, never the server). The cell waits
for ``strata: listening on http://HOST:PORT``, then for ``/health``, reads the plan from ``/v1/status``,
and sends each prompt as a list of token ids to ``/v1/completions`` (temperature from the cell, 0 by
default; thinking off; 64 tokens by default). It records, per request, the reply's token ids and top-2
logit margins, the chunk and the slots lent, halvings, errors and engine exits with their exit code,
and timings. After the starts, one more short-lived process opens the engine with the same flags and
reports ``layout(T)`` for each prompt's chunk ("what the short chunk needs").

Prompts are random token ids of the model's ordinary vocabulary, drawn from (prompt_seed, prompt
index): prompt k is the same in every cell and start (so replies compare), and no two prompts of a cell
share a prefix (each starts with its own nonce, so nothing can be reused between requests).

``python -m repro_matrix._cell layout MODEL CONFIG_JSON N,N,... [T,T,...]`` is that helper: for each
prompt length N its chunk and what the plan predicts (``strata._memplan.predict``), and ``layout(T)``
of every chunk involved.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from strata.server.spawn import ServeProcess

from ._matrix import Cell, Matrix

__all__ = [
    "NONCE_TOKENS",
    "make_prompts",
    "model_path",
    "ordinary_token_ids",
    "run_cell",
    "serve_command",
]

NONCE_TOKENS = 8
_EXIT_CODE = re.compile(r"exit code (-?\d+)")
_START_TIMEOUT_S = float(os.environ.get("REPRO_MATRIX_START_TIMEOUT", "180"))
_REQUEST_TIMEOUT_S = float(os.environ.get("REPRO_MATRIX_REQUEST_TIMEOUT", "900"))
_LOG_LINES = 200

# servers started by this process, so that an interrupted sweep leaves none behind
_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()


def model_path(model: str) -> Path:
    """A preset name (made once by strata.model.ensure_model) or a path to a GGUF file."""
    p = Path(model).expanduser()
    if p.suffix == ".gguf" or p.exists():
        if not p.is_file():
            raise FileNotFoundError(
                f"model file {p} does not exist; give a .gguf path or a preset name (tiny, small)"
            )
        return p.resolve()
    from strata.model import ensure_model

    return Path(ensure_model(model))


@lru_cache(maxsize=8)
def ordinary_token_ids(path: str) -> tuple[int, ...]:
    """Ids of the vocabulary's ordinary tokens (not control, not unused), read from the GGUF."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    f = r.fields.get("tokenizer.ggml.token_type")
    if f is None:
        toks = r.fields.get("tokenizer.ggml.tokens")
        n = len(toks.data) if toks is not None else 0
        return tuple(range(n))
    types = [int(f.parts[i][0]) for i in f.data]
    return tuple(i for i, t in enumerate(types) if t == 1)  # 1 = NORMAL


def make_prompts(vocab: Sequence[int], lengths: Sequence[int], seed: int) -> list[list[int]]:
    """Prompt k: a nonce of NONCE_TOKENS ids from (seed, k), then filler ids from (seed, k) too."""
    ids = np.asarray(vocab, dtype=np.int64)
    out = []
    for k, n in enumerate(lengths):
        rng = np.random.default_rng([seed, k, 0x5EED])
        out.append([int(x) for x in ids[rng.integers(0, len(ids), size=n)]])
    # a nonce collision between two prompts of one cell would let one reuse the other's prefix
    heads = {tuple(p[:NONCE_TOKENS]) for p in out}
    if len(heads) != len(out):
        raise RuntimeError("two prompts share their nonce; change prompt_seed")
    return out


def _strata_cmd() -> list[str]:
    """How to run `strata`: this Python's strata, or REPRO_MATRIX_STRATA (another install's `strata`
    command, e.g. an older release's virtual environment, to run the same matrix against it)."""
    other = os.environ.get("REPRO_MATRIX_STRATA")
    if other:
        return shlex.split(other)
    return [sys.executable, "-c", "import sys; from strata.cli import main; sys.exit(main())"]


def serve_command(model: Path | str, cell: Cell, extra: Sequence[str] = ()) -> list[str]:
    """The `strata serve` command line of one cell (as a user would type it, with `strata`)."""
    return ["strata", "serve", "--model", str(model), *cell.config.to_cli_args(), *extra]


class _Server:
    """A `strata serve` process on a free loopback port (strata.server.spawn), its output kept in a ring
    of lines; it goes away with the thread that started it, even when the harness is killed."""

    def __init__(self, model: Path, cell: Cell, env: dict[str, str], cwd: str | None = None):
        args = [
            *_strata_cmd(),
            "serve",
            "--model",
            str(model),
            *cell.config.to_cli_args(),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ]
        self.sp = ServeProcess(args, env=env, cwd=cwd, parent_death=True, log_lines=_LOG_LINES)
        self.proc = self.sp.proc
        self.log = self.sp.log
        with _LIVE_LOCK:
            _LIVE.add(self.proc)

    @property
    def url(self) -> str | None:
        return self.sp.url

    def wait_listening(self, timeout: float) -> str | None:
        return self.sp.wait_listening(timeout)

    def died(self) -> bool:
        return self.sp.exited() is not None

    def stop(self) -> int | None:
        """Stop the server; its exit code if it had already exited by itself, else None."""
        code = self.sp.exited()
        self.sp.stop(15)
        with _LIVE_LOCK:
            _LIVE.discard(self.proc)
        return code

    def tail(self, n: int = 30) -> str:
        return self.sp.tail(n)


def stop_all_servers() -> None:
    """Stop every server this process started (an interrupted sweep)."""
    with _LIVE_LOCK:
        procs = list(_LIVE)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def _wait_ready(client: httpx.Client, server: _Server, deadline: float) -> dict[str, Any] | None:
    """Poll /health until the engine is up; the last /v1/status seen (None if never reachable)."""
    status: dict[str, Any] | None = None
    while time.monotonic() < deadline and not server.died():
        try:
            h = client.get("/health")
            s = client.get("/v1/status")
            if s.status_code == 200:
                status = s.json()
            if h.status_code == 200:
                return status
            if status and status.get("state") == "failed":
                return status
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return status


def _request(client: httpx.Client, prompt: list[int], req: dict[str, Any], k: int) -> dict[str, Any]:
    body = {
        "model": "strata",
        "prompt": prompt,
        "max_tokens": int(req["max_tokens"]),
        "temperature": float(req["temperature"]),
        "seed": int(req["seed"]),
        "top_k": int(req["top_k"]),
        "top_p": float(req["top_p"]),
        "min_p": float(req["min_p"]),
        "chat_template_kwargs": {"enable_thinking": False},
        "stream": False,
    }
    out: dict[str, Any] = {"prompt": k, "prompt_tokens": len(prompt)}
    t0 = time.monotonic()
    try:
        r = client.post("/v1/completions", json=body, timeout=_REQUEST_TIMEOUT_S)
    except httpx.HTTPError as e:
        out.update(status="error", error_code="connection", error_message=f"{type(e).__name__}: {e}")
        out["wall_ms"] = (time.monotonic() - t0) * 1000
        return out
    out["wall_ms"] = (time.monotonic() - t0) * 1000
    out["http_status"] = r.status_code
    try:
        data = r.json()
    except ValueError:
        data = {"error": {"message": r.text[:2000], "code": f"http_{r.status_code}"}}
    if r.status_code == 200 and "error" not in data:
        st = data.get("strata") or {}
        out.update(
            status="ok",
            tokens=[int(t) for t in st.get("token_ids", [])],
            margins=[float(m) for m in st.get("top2_margins", [])],
            chunk=st.get("chunk"),
            loan_slots=st.get("loan_slots"),
            halvings=st.get("halvings") or 0,
            hits=st.get("hits"),
            lookups=st.get("lookups"),
            timings=data.get("timings"),
            finish_reason=(data.get("choices") or [{}])[0].get("finish_reason"),
        )
        return out
    err = data.get("error") or {}
    msg = str(err.get("message", ""))
    out.update(status="error", error_code=err.get("code") or f"http_{r.status_code}", error_message=msg)
    m = _EXIT_CODE.search(msg)
    if m:
        out["exit_code"] = int(m.group(1))
    return out


# the server's own error lines ("strata serve: the engine could not start: ...", "strata: ...")
_OWN_WORDS = re.compile(
    r"^(?:strata(?: serve)?|engine): (?!listening on)(.*(?:error|fail|cannot|could not|not found|"
    r"missing|too |invalid|unknown|refus|exited).*)$",
    re.I,
)


def own_words(lines: Sequence[str]) -> str | None:
    """The server's last line that says why it stopped, as it wrote it (None when it said nothing)."""
    lines = [ln.rstrip() for ln in lines if ln.strip()]
    for ln in reversed(lines):
        if ln.startswith("strata serve: ") and _OWN_WORDS.match(ln):
            return ln
    for ln in reversed(lines):
        if _OWN_WORDS.match(ln) or "Error" in ln:
            return ln
    return lines[-1] if lines else None


def _record_start_failure(rec: dict[str, Any], server: _Server, elapsed: float) -> None:
    """A server that never listened: its exit code and its own last words, not a guess."""
    if not server.died():
        # the output closed (or the wait ran out): a server that is going away gets a moment to be reaped
        try:
            server.proc.wait(5 if server.sp.settled() else 0.1)
        except subprocess.TimeoutExpired:
            pass
    server.sp.join_output(2)
    code = server.proc.poll()
    words = own_words(list(server.log))
    rec["start_exit_code"] = code
    rec["start_message"] = words
    rec["start_s"] = round(elapsed, 3)
    if code is None:
        rec["start_error"] = f"the server did not listen within {_START_TIMEOUT_S:g} s" + (
            f"; its last line: {words}" if words else " and printed nothing"
        )
    else:
        rec["start_error"] = (
            f"the server exited with exit code {code} after {elapsed:.1f} s, before it listened"
            + (f": {words}" if words else " (it printed nothing)")
        )


def _plan_of(status: dict[str, Any] | None) -> dict[str, Any] | None:
    if not status:
        return None
    keep = ("plan", "info", "config", "max_context", "budget", "engine")
    return {k: status.get(k) for k in keep if k in status}


def _one_start(
    model: Path,
    cell: Cell,
    get_prompts: Callable[[dict[str, Any]], list[list[int]]],
    index: int,
    env: dict[str, str],
    on_event: Callable[[str], None] | None,
    cwd: str | None = None,
) -> dict[str, Any]:
    rec: dict[str, Any] = {"start": index, "start_error": None, "requests": []}
    t0 = time.monotonic()
    server = _Server(model, cell, env, cwd)
    try:
        url = server.wait_listening(_START_TIMEOUT_S)
        if url is None:
            _record_start_failure(rec, server, time.monotonic() - t0)
            return rec
        with httpx.Client(base_url=url, timeout=30) as client:
            status = _wait_ready(client, server, time.monotonic() + _START_TIMEOUT_S)
            rec["status"] = _plan_of(status)
            rec["ready_s"] = time.monotonic() - t0
            if status is None or status.get("state") == "failed" or not status.get("plan"):
                # ask once: the server answers a request with the engine's start-up error
                if server.died():
                    _record_start_failure(rec, server, time.monotonic() - t0)
                    return rec
                probe = _request(client, [1, 2, 3, 4], {**cell.request, "max_tokens": 1}, -1)
                eng = (status or {}).get("engine") or {}
                words = probe.get("error_message") or eng.get("error")
                rec["start_message"] = words or None
                if eng.get("last_exit_code") is not None:
                    rec["start_exit_code"] = eng.get("last_exit_code")
                rec["start_error"] = words or "the engine did not start (the server gave no reason)"
                return rec
            prompts = get_prompts(status)
            for k, prompt in enumerate(prompts):
                if server.died():
                    rec["requests"].append(
                        {
                            "prompt": k,
                            "status": "error",
                            "error_code": "server_exited",
                            "error_message": "the server process exited",
                        }
                    )
                    continue
                r = _request(client, prompt, cell.request, k)
                if r["status"] != "ok":
                    try:
                        eng = client.get("/v1/status").json().get("engine") or {}
                        r["engine_after"] = eng
                        if r.get("exit_code") is None and r.get("error_code") == "engine_exited":
                            r["exit_code"] = eng.get("last_exit_code")
                    except (httpx.HTTPError, ValueError):
                        pass
                    if on_event:
                        on_event(f"prompt {k}: {r.get('error_code')}")
                rec["requests"].append(r)
            try:
                final = client.get("/v1/status").json()
                rec["final"] = {"stats": final.get("stats"), "engine": final.get("engine")}
            except (httpx.HTTPError, ValueError):
                pass
    finally:
        died = server.died()
        code = server.stop()
        rec["server_died"] = died
        rec["server_exit_code"] = code
        rec["log_tail"] = server.tail()
        rec["wall_s"] = time.monotonic() - t0
    return rec


def _layouts(
    model: Path, cell: Cell, lengths: Sequence[int], chunks: Sequence[int], env: dict[str, str]
) -> dict[str, Any]:
    """Plan, each prompt's chunk and layout(T), from a separate short-lived process that opens the engine."""
    args = [
        sys.executable,
        "-m",
        "repro_matrix._cell",
        "layout",
        str(model),
        json.dumps(cell.engine),
        ",".join(str(n) for n in lengths),
        ",".join(str(t) for t in sorted(set(chunks))),
    ]
    try:
        p = subprocess.run(args, capture_output=True, text=True, timeout=_START_TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "the layout helper did not finish in time"}
    if p.returncode != 0:
        return {"error": (p.stderr or p.stdout).strip()[-2000:]}
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": f"the layout helper printed no JSON: {p.stdout[-500:]}"}


def run_cell(
    matrix: Matrix,
    cell: Cell,
    *,
    env: dict[str, str] | None = None,
    on_event: Callable[[str], None] | None = None,
    layouts: bool = True,
    cwd: str | Path | None = None,
) -> dict[str, Any]:
    """Run one cell (all its starts) and return its record (JSON-ready). ``layouts=False`` leaves out the
    layout helper (``bisect --commits`` runs other commits' strata, whose engine the helper would not use);
    ``cwd`` is where the servers start (a worktree, whose packages a Python started there imports first)."""
    env = dict(os.environ if env is None else env)
    started = datetime.now(timezone.utc)
    t0 = time.monotonic()
    model = model_path(matrix.model)
    record: dict[str, Any] = {
        "version": 1,
        "cell_id": cell.cell_id,
        "cell": cell.to_dict(),
        "model": str(model),
        "model_spec": matrix.model,
        "started_at": started.isoformat(timespec="seconds"),
        "host_threads": os.cpu_count(),
        "gpu": env.get("CUDA_VISIBLE_DEVICES"),
    }
    max_tokens = int(cell.request["max_tokens"])
    vocab = ordinary_token_ids(str(model))
    made: dict[str, Any] = {}

    def get_prompts(status: dict[str, Any]) -> list[list[int]]:
        # the prompts are capped by the context the engine planned: made once, from the first start
        if "prompts" not in made:
            ctx = int(status.get("max_context") or (status.get("plan") or {}).get("max_context") or 0)
            ctx = ctx or _model_context(model)
            spec = matrix.prompt_lengths(ctx, max_tokens)
            made["spec"] = spec
            made["prompts"] = make_prompts(vocab, [n for n, _ in spec], matrix.prompt_seed)
            record["max_context"] = ctx
            record["prompts"] = [{"index": k, "length": n, "chunk": c} for k, (n, c) in enumerate(spec)]
        return made["prompts"]

    starts = [
        _one_start(model, cell, get_prompts, s, env, on_event, None if cwd is None else str(cwd))
        for s in range(matrix.starts)
    ]
    record["starts"] = starts
    plan_src = next((st["status"] for st in starts if st.get("status") and st["status"].get("plan")), None)
    record["plan"] = (plan_src or {}).get("plan")
    record["budget"] = (plan_src or {}).get("budget")
    auto = (record["plan"] or {}).get("auto_chunk")
    if record["plan"] and not layouts:
        record["layouts"] = {"error": "not asked for"}
    elif record["plan"]:
        # each prompt's chunk as the plan decides it, and the chunks the engine reported using
        chunks = {int(r["chunk"]) for st in starts for r in st.get("requests", []) if r.get("chunk")}
        record["layouts"] = _layouts(
            model, cell, [n for n, _ in made.get("spec", [])], [*chunks, *([auto] if auto else [])], env
        )
    else:
        record["layouts"] = {"error": "no engine start succeeded"}
    record["finished_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    record["wall_s"] = time.monotonic() - t0
    return record


def _model_context(model: Path) -> int:
    """The engine's default context: the model's training context, capped at 4096."""
    from gguf import GGUFReader

    r = GGUFReader(str(model))
    for name, f in r.fields.items():
        if name.endswith(".context_length"):
            return min(int(f.parts[f.data[0]][0]), 4096)
    return 4096


# ---- the layout helper (a separate process: the harness never loads the native library) ------------


def _layout_main(argv: Sequence[str]) -> int:
    import dataclasses

    from strata import Engine, EngineConfig

    model, engine_json, lengths, chunks = argv[0], argv[1], argv[2], argv[3] if len(argv) > 3 else ""
    cfg = EngineConfig.from_dict(json.loads(engine_json) if engine_json else {})
    out: dict[str, Any] = {"layouts": {}, "predicted": {}}
    with Engine(model, cfg) as eng:
        out["plan"] = dataclasses.asdict(eng.plan)
        wanted = {int(x) for x in chunks.split(",") if x}
        predict: Any = None
        try:  # what the plan will do with each prompt (its chunk, loan, verdict), where strata says
            from strata._memplan import predict
        except ImportError:
            pass
        for n in (int(x) for x in lengths.split(",") if x):
            if predict is not None:
                pr = dataclasses.asdict(predict(eng, n))
                out["predicted"][str(n)] = pr
                wanted.add(int(pr["chunk"]))
            else:
                wanted.add(min(n, eng.plan.auto_chunk))
        for t in sorted(wanted):
            out["layouts"][str(t)] = dataclasses.asdict(eng.layout(t))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "layout":
        sys.exit(_layout_main(sys.argv[2:]))
    print("usage: python -m repro_matrix._cell layout MODEL ENGINE_JSON N,N,... [T,T,...]", file=sys.stderr)
    sys.exit(2)
