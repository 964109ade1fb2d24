"""strata.server.spawn.ServeProcess, the one way the chat, the matrix and the tests start a server: the
URL from the listening line, the lines before it, the output kept, a child that ends before listening."""

from __future__ import annotations

import sys

from strata.server.spawn import ServeProcess


def _child(script: str) -> list[str]:
    return [sys.executable, "-u", "-c", script]


def test_url_lines_before_it_and_the_log() -> None:
    seen: list[str] = []
    sp = ServeProcess(
        _child(
            "import time\n"
            "print('engine: plan 12 slots')\n"
            "print('strata: listening on http://127.0.0.1:4321/')\n"
            "print('after')\n"
            "time.sleep(60)\n"
        ),
        on_line=seen.append,
        new_session=True,
    )
    try:
        assert sp.wait_listening(60) == "http://127.0.0.1:4321"
        assert seen == ["engine: plan 12 slots"] and sp.exited() is None
    finally:
        code = sp.stop(10, group=True)
    assert code != 0 and sp.exited() == code
    assert list(sp.log)[:2] == ["engine: plan 12 slots", "strata: listening on http://127.0.0.1:4321/"]


def test_a_child_that_ends_before_listening() -> None:
    sp = ServeProcess(_child("import sys; print('strata serve: error: no model'); sys.exit(2)"))
    assert sp.wait_listening(60) is None and sp.settled()
    assert sp.stop() == 2 and sp.tail() == "strata serve: error: no model"
