"""How ``strata chat`` starts its server and keeps what it writes: the API key stays off the command
line (where every user of the machine can read it), and the files holding the history are 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from strata.model import ensure_model
from strata_tui.screens.chat import _write_text
from strata_tui.server_process import ServerProcess
from strata_tui.store import Store, StoredMessage

pytestmark = pytest.mark.timeout(180)


def test_the_chats_server_gets_its_key_through_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_API_KEY", "a-key-of-the-users-shell")  # not the one the chat chose
    key = "sk-chat-only-5f0c1d"
    proc = ServerProcess(ensure_model("tiny"), ["--threads", "1"], api_key=key)
    assert key not in " ".join(proc.command(ensure_model("tiny")))
    url = proc.start(timeout=120)
    try:
        pid = proc.pid
        assert pid is not None
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        assert key not in cmdline and "--api-key" not in cmdline
        # and the server does need it: the key arrived
        assert httpx.get(f"{url}/v1/models", timeout=30).status_code == 401
        ok = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert ok.status_code == 200
        assert (
            httpx.get(
                f"{url}/v1/models", headers={"Authorization": "Bearer a-key-of-the-users-shell"}, timeout=30
            ).status_code
            == 401
        )
    finally:
        proc.stop()


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_history_files_are_the_users_alone(tmp_path: Path) -> None:
    old = os.umask(0o022)  # a usual umask, which leaves new files readable by everyone
    try:
        db = tmp_path / "data" / "chat.sqlite3"
        s = Store(db)
        c = s.create("secret plans")
        s.add_message(c.id, StoredMessage(role="user", content="the vault PIN is 481592"))
        s.close()
        assert _mode(db) == 0o600 and _mode(db.parent) == 0o700
        assert [p.name for p in db.parent.iterdir() if _mode(p) != 0o600] == []
        # a database made readable by someone else is tightened when the chat opens it
        db.chmod(0o644)
        Store(db).close()
        assert _mode(db) == 0o600
        # an export holds the conversation too
        out = tmp_path / "exports" / "secret-plans.md"
        _write_text(out, "# secret plans\n")
        assert _mode(out) == 0o600 and out.read_text() == "# secret plans\n"
    finally:
        os.umask(old)
