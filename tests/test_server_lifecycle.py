"""The engine worker's lifecycle seen through the app: loading, ready, a worker that cannot start."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from strata import EngineConfig
from strata.chat_template import ChatTemplate
from strata.model import ensure_model
from strata.server.app import ServerState, create_app
from strata.server.supervisor import EngineStartError, Supervisor
from strata.tokenizer import Tokenizer

pytestmark = pytest.mark.timeout(120)


def _launcher(tmp_path: Path, body: str) -> str:
    """A stand-in for the Python executable that the supervisor starts the worker with."""
    p = tmp_path / "python-launcher.sh"
    p.write_text(f"#!/bin/sh\n{body}\n")
    p.chmod(0o755)
    return str(p)


def _app(sup: Supervisor) -> httpx.AsyncClient:
    tok = Tokenizer.from_gguf(ensure_model("tiny"))
    state = ServerState(
        supervisor=sup, tokenizer=tok, template=ChatTemplate(tok.chat_template), model_name="tiny"
    )
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(state)), base_url="http://strata")


def test_health_is_503_while_loading_then_200(tmp_path: Path) -> None:
    slow = _launcher(tmp_path, f'sleep 1\nexec "{sys.executable}" "$@"')

    async def main() -> None:
        sup = Supervisor(str(ensure_model("tiny")), EngineConfig(threads=1), echo_log=False, python=slow)
        async with _app(sup) as http:
            start = asyncio.create_task(sup.start())
            await asyncio.sleep(0.2)
            h = await http.get("/health")
            assert h.status_code == 503 and h.json()["status"] == "loading"
            st = (await http.get("/v1/status")).json()
            assert st["state"] == "loading" and st["plan"] is None and st["stats"] is None
            await start
            assert (await http.get("/health")).status_code == 200
            r = await http.post(
                "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}
            )
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2
        await sup.close()

    asyncio.run(main())


def test_worker_that_dies_while_starting_is_a_clear_error(tmp_path: Path) -> None:
    dying = _launcher(tmp_path, 'echo "cannot map the model: out of address space" >&2\nexit 7')

    async def main() -> None:
        sup = Supervisor(str(ensure_model("tiny")), EngineConfig(), echo_log=False, python=dying)
        with pytest.raises(EngineStartError) as e:
            await sup.start()
        assert "exit code 7" in str(e.value) and "out of address space" in str(e.value)
        async with _app(sup) as http:
            h = await http.get("/health")
            assert h.status_code == 503 and h.json()["status"] == "failed"
            assert "exit code 7" in h.json()["error"]
            # a request tries again, and answers with the start-up error instead of hanging
            r = await http.post("/v1/completions", json={"prompt": [1, 2], "max_tokens": 2})
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_start_failed"
            # the client is told what happened; the engine's log stays in the server's output
            assert "exit code 7" in r.json()["error"]["message"]
            assert "out of address space" not in r.json()["error"]["message"] + h.json()["error"]
        await sup.close()

    asyncio.run(main())


def test_engine_start_failure_message_is_the_engines(tmp_path: Path) -> None:
    async def main() -> None:
        sup = Supervisor(str(ensure_model("tiny")), EngineConfig(vram_budget=1 << 20), echo_log=False)
        with pytest.raises(EngineStartError) as e:
            await sup.start()
        assert "budget" in str(e.value).lower() and sup.state == "failed"
        await sup.close()

    asyncio.run(main())
