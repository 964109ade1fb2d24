"""What the engine is doing: state, prompt progress, speed, context, expert cache and memory.

Fed by the screen with each ``/v1/status`` answer and with what the client measures while a reply
streams (live tokens/s and time to first token).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import ProgressBar, Static

__all__ = ["EnginePanel", "describe_state", "sequences_line"]

_STATES = {
    "loading": ("loading the model", "warning"),
    "idle": ("idle", "success"),
    "reading": ("reading the prompt", "accent"),
    "generating": ("generating", "accent"),
    "restarting": ("restarting the engine", "warning"),
    "failed": ("failed", "error"),
    "starting": ("starting the server", "warning"),
    "unreachable": ("unreachable", "error"),
}


def describe_state(state: str) -> str:
    return _STATES.get(state, (state, ""))[0]


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= (1 << 30) else f"{n / (1 << 20):.0f} MiB"


def _mem(used: float, total: float) -> str:
    if total >= (1 << 30):
        return f"{used / (1 << 30):.1f} / {total / (1 << 30):.1f} GiB"
    return f"{used / (1 << 20):.0f} / {total / (1 << 20):.0f} MiB"


def _eta(seconds: float) -> str:
    if seconds >= 60:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{seconds:.1f} s"


def sequences_line(queue: dict[str, Any]) -> str | None:
    """The engine's sequences (``strata serve --parallel N``) as one line: how many of N run and what
    they do; None for a server of one sequence."""
    n = int(queue.get("parallel") or 1)
    if n <= 1:
        return None
    seqs = queue.get("sequences") or []
    reading = sum(1 for q in seqs if q.get("state") == "reading")
    line = f"{len(seqs)} / {n}"
    if seqs:
        line += f" · {reading} reading" if reading else " · generating"
    return line


class EnginePanel(Vertical):
    """The right-hand panel; shown only when the server is strata."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.state = "starting"
        self.status: dict[str, Any] = {}
        self.live_tps: float | None = None
        self.ttft_s: float | None = None
        self.context_used: int | None = None
        self.detail = ""

    def compose(self) -> ComposeResult:
        yield Static("Engine", classes="panel-title")
        yield Static(id="engine-state")
        yield Static(id="prompt-label")
        yield ProgressBar(total=100, show_eta=False, id="prompt-bar")
        yield Static(id="engine-lines")

    def on_mount(self) -> None:
        self.refresh_view()

    def set_starting(self, detail: str) -> None:
        self.state = "starting"
        self.detail = detail
        self.refresh_view()

    def set_unreachable(self) -> None:
        self.state = "unreachable"
        self.detail = ""
        self.refresh_view()

    def set_status(self, status: dict[str, Any]) -> None:
        self.status = status
        self.state = str(status.get("state") or "idle")
        self.detail = ""
        self.refresh_view()

    def set_live(
        self, *, tps: float | None = None, ttft_s: float | None = None, context_used: int | None = None
    ) -> None:
        if tps is not None:
            self.live_tps = tps
        if ttft_s is not None:
            self.ttft_s = ttft_s
        if context_used is not None:
            self.context_used = context_used
        self.refresh_view()

    def refresh_view(self) -> None:
        if not self.is_mounted:
            return
        label, style = _STATES.get(self.state, (self.state, ""))
        st = Text.assemble(("● ", _rich_style(style)), (label, "bold"))
        self.query_one("#engine-state", Static).update(st, layout=False)

        s = self.status
        prompt = s.get("prompt") if self.state == "reading" else None
        bar = self.query_one("#prompt-bar", ProgressBar)
        plabel = self.query_one("#prompt-label", Static)
        if prompt and prompt.get("total"):
            done, total = int(prompt.get("done") or 0), int(prompt["total"])
            read_tps = float(prompt.get("tokens_per_second") or 0.0)
            bar.update(total=total, progress=done)
            left = f" · {_eta((total - done) / read_tps)} left" if read_tps > 0 else ""
            plabel.update(f"prompt {done:,} / {total:,} tokens\n{read_tps:,.0f} tok/s{left}", layout=False)
            bar.display = plabel.display = True
        else:
            bar.display = plabel.display = False

        lines: list[tuple[str, str]] = []
        if self.detail:
            lines.append(("", self.detail))
        model = str(s.get("model") or "")
        if model:
            lines.append(("model", model if len(model) <= 22 else model[:21] + "…"))
        lr = ((s.get("last_request") or {}).get("timings")) or {}
        tps: float | None = (
            self.live_tps if self.state == "generating" and self.live_tps else lr.get("predicted_per_second")
        )
        if tps is None:
            tps = self.live_tps
        lines.append(("decode", f"{tps:,.1f} tok/s" if tps else "–"))
        lines.append(("TTFT", f"{self.ttft_s:.2f} s" if self.ttft_s is not None else "–"))
        stats = s.get("stats") or {}
        plan = s.get("plan") or {}
        max_ctx = s.get("max_context") or plan.get("max_context")
        used = self.context_used if self.context_used is not None else stats.get("n_past")
        if max_ctx:
            lines.append(("context", f"{int(used or 0):,} / {int(max_ctx):,}"))
        lookups = int(stats.get("lookups") or 0)
        if lookups:
            lines.append(("hit rate", f"{100.0 * int(stats.get('hits') or 0) / lookups:.1f}%"))
        elif stats:
            lines.append(("hit rate", "–"))
        budget = s.get("budget") or {}
        slots = budget.get("slots", plan.get("n_slots"))
        lent = budget.get("slots_lent_now", stats.get("slots_lent_now"))
        if slots is not None:
            lines.append(("slots", f"{int(slots):,} · lent {int(lent or 0):,}"))
        chunk = stats.get("last_chunk") or plan.get("auto_chunk")
        if chunk:
            lines.append(("chunk", f"{int(chunk):,} tokens"))
        gpu = s.get("gpu")
        if gpu:
            lines.append(("GPU", str(gpu.get("name", ""))[:22]))
            mem = _mem(float(gpu.get("memory_used") or 0), float(gpu.get("memory_total") or 0))
            util = gpu.get("utilization")
            lines.append(("memory", mem + (f" · {int(util)}%" if util is not None else "")))
        elif budget:
            dev = budget.get("device", "cpu")
            nbytes = float(budget.get("budget_bytes") or 0)
            if nbytes <= 0:
                lines.append(("memory", "no cache budget"))
            else:
                lines.append(("memory", f"{_gib(nbytes)}" + (" emulated" if dev == "cpu" else " budget")))
        eng = s.get("engine") or {}
        if eng.get("restarts"):
            code = eng.get("last_exit_code")
            lines.append(
                ("restarts", f"{eng['restarts']}" + (f" (last exit {code})" if code is not None else ""))
            )
        seqs = sequences_line(s.get("queue") or {})
        if seqs is not None:
            lines.append(("running", seqs))
        q = (s.get("queue") or {}).get("length")
        if q:
            lines.append(("queue", str(q)))
        text = Text()
        for i, (k, v) in enumerate(lines):
            if i:
                text.append("\n")
            if k:
                text.append(f"{k:<9}", style="dim")
            text.append(v)
        # fixed height in the stylesheet: a new figure repaints the panel without a layout of the screen
        self.query_one("#engine-lines", Static).update(text, layout=False)


def _rich_style(kind: str) -> str:
    return {"success": "green", "warning": "yellow", "accent": "cyan", "error": "red"}.get(kind, "")
