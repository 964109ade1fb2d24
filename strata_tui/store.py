"""Conversations in SQLite, under the user's data folder (``STRATA_DATA_DIR`` overrides it).

One file, ``chat.sqlite3``, two tables: ``conversations`` (title, system prompt, sampling settings as
JSON) and ``messages`` (role, text, reasoning, timings as JSON). The store is synchronous and small; the
app calls it from a single worker thread so that writes keep their order and never block the screen.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import platformdirs

from strata._failure import UserError

__all__ = [
    "Conversation",
    "Settings",
    "Store",
    "StoreError",
    "StoredMessage",
    "data_dir",
    "default_db_path",
    "export_dir",
]

_list = list  # Store.list shadows the builtin inside the class body

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    settings TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    reasoning TEXT NOT NULL DEFAULT '',
    meta TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""


_TABLES = {"conversations", "messages", "sqlite_sequence"}


class StoreError(UserError):
    """The database file cannot be used (damaged, or another program's); the message says what to do."""


def data_dir() -> Path:
    env = os.environ.get("STRATA_DATA_DIR")
    return Path(env) if env else Path(platformdirs.user_data_dir("strata", appauthor=False))


def export_dir() -> Path:
    """Where Ctrl+O offers to write an export: ``exports/`` in the data folder."""
    return data_dir() / "exports"


def default_db_path() -> Path:
    return data_dir() / "chat.sqlite3"


@dataclass
class Settings:
    """Per-conversation sampling settings; ``None`` leaves the server's default."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = 512
    seed: int | None = None
    thinking: bool = True

    def request_params(self) -> dict[str, Any]:
        """The request fields these settings set."""
        p: dict[str, Any] = {}
        if self.temperature is not None:
            p["temperature"] = self.temperature
        if self.top_p is not None:
            p["top_p"] = self.top_p
        if self.max_tokens is not None:
            p["max_tokens"] = self.max_tokens
        if self.seed is not None:
            p["seed"] = self.seed
        p["chat_template_kwargs"] = {"enable_thinking": self.thinking}
        return p

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Settings:
        try:
            d = json.loads(text or "{}")
        except ValueError:
            d = {}
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def describe(self) -> str:
        def show(v: object) -> str:
            return "default" if v is None else str(v)

        return (
            f"temp {show(self.temperature)} · top-p {show(self.top_p)} · max {show(self.max_tokens)} · "
            f"seed {show(self.seed)} · think {'on' if self.thinking else 'off'}"
        )


@dataclass(eq=False)  # messages are compared by identity: two equal texts are still two messages
class StoredMessage:
    role: str  # "user" | "assistant"
    content: str
    reasoning: str = ""
    meta: dict[str, Any] = field(default_factory=dict)
    id: int | None = None


@dataclass
class Conversation:
    id: int
    title: str
    system_prompt: str = ""
    settings: Settings = field(default_factory=Settings)
    updated: float = 0.0


class Store:
    """The conversation database."""

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else default_db_path()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # the history is the user's alone: the file is made (or tightened to) 0600 before SQLite opens
        # it, and SQLite gives its journal the database file's mode
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.fchmod(fd, 0o600)
        finally:
            os.close(fd)
        # one worker thread uses the connection at a time (the app serialises calls)
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA foreign_keys = ON")
            tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            foreign = sorted(tables - _TABLES)
            if foreign:  # another program's database: never add tables to it
                raise StoreError(
                    f"{self.path} is not a strata chat database (it has the tables {', '.join(foreign[:5])}): "
                    "give another file with --db, or leave --db out for the default one"
                )
            self._db.executescript(_SCHEMA)
            self._db.commit()
        except sqlite3.DatabaseError as e:
            self._db.close()
            raise StoreError(
                f"{self.path} cannot be used as the chat database ({e}): it is damaged or not a strata chat "
                "database; move it away (a new one is made in its place) or give another file with --db"
            ) from None
        except StoreError:
            self._db.close()
            raise

    def close(self) -> None:
        self._db.close()

    # ---- conversations ----

    def create(
        self, title: str = "New conversation", system_prompt: str = "", settings: Settings | None = None
    ) -> Conversation:
        now = time.time()
        s = settings or Settings()
        cur = self._db.execute(
            "INSERT INTO conversations (title, system_prompt, settings, created, updated) VALUES (?, ?, ?, ?, ?)",
            (title, system_prompt, s.to_json(), now, now),
        )
        self._db.commit()
        assert cur.lastrowid is not None
        return Conversation(
            id=cur.lastrowid, title=title, system_prompt=system_prompt, settings=s, updated=now
        )

    def _conv(self, row: sqlite3.Row) -> Conversation:
        return Conversation(
            id=row["id"],
            title=row["title"],
            system_prompt=row["system_prompt"],
            settings=Settings.from_json(row["settings"]),
            updated=row["updated"],
        )

    def get(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        return self._conv(row) if row else None

    def list(self, search: str = "") -> list[Conversation]:
        """Conversations, most recently used first; ``search`` matches titles and message text."""
        if search:
            pat = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ? ESCAPE '\\' OR EXISTS ("
                " SELECT 1 FROM messages m WHERE m.conversation_id = c.id AND m.content LIKE ? ESCAPE '\\')"
                " ORDER BY c.updated DESC, c.id DESC",
                (pat, pat),
            ).fetchall()
        else:
            rows = self._db.execute("SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        return [self._conv(r) for r in rows]

    def rename(self, conversation_id: int, title: str) -> None:
        self._db.execute("UPDATE conversations SET title = ? WHERE id = ?", (title, conversation_id))
        self._db.commit()

    def set_system_prompt(self, conversation_id: int, text: str) -> None:
        self._db.execute("UPDATE conversations SET system_prompt = ? WHERE id = ?", (text, conversation_id))
        self._db.commit()

    def set_settings(self, conversation_id: int, settings: Settings) -> None:
        self._db.execute(
            "UPDATE conversations SET settings = ? WHERE id = ?", (settings.to_json(), conversation_id)
        )
        self._db.commit()

    def delete(self, conversation_id: int) -> None:
        self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))
        self._db.commit()

    # ---- messages ----

    def messages(self, conversation_id: int) -> _list[StoredMessage]:
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY id", (conversation_id,)
        ).fetchall()
        return [
            StoredMessage(
                id=r["id"],
                role=r["role"],
                content=r["content"],
                reasoning=r["reasoning"],
                meta=json.loads(r["meta"]),
            )
            for r in rows
        ]

    def add_message(self, conversation_id: int, msg: StoredMessage) -> StoredMessage:
        now = time.time()
        cur = self._db.execute(
            "INSERT INTO messages (conversation_id, role, content, reasoning, meta, created) VALUES (?, ?, ?, ?, ?, ?)",
            (conversation_id, msg.role, msg.content, msg.reasoning, json.dumps(msg.meta), now),
        )
        self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?", (now, conversation_id))
        self._db.commit()
        return dataclasses.replace(msg, id=cur.lastrowid)

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Delete a message and every later one (regenerate and edit rewind the conversation)."""
        self._db.execute(
            "DELETE FROM messages WHERE conversation_id = ? AND id >= ?", (conversation_id, message_id)
        )
        self._db.commit()

    # ---- export ----

    def export_markdown(self, conversation_id: int) -> str:
        conv = self.get(conversation_id)
        if conv is None:
            raise KeyError(f"no conversation {conversation_id}")
        return to_markdown(conv, self.messages(conversation_id))


def to_markdown(conv: Conversation, messages: list[StoredMessage]) -> str:
    """A conversation as a Markdown document."""
    out = [f"# {conv.title}", ""]
    out += [f"_Settings: {conv.settings.describe()}_", ""]
    if conv.system_prompt:
        out += ["## System", "", conv.system_prompt, ""]
    for m in messages:
        out += [f"## {'You' if m.role == 'user' else 'Assistant'}", ""]
        if m.reasoning:
            out += ["<details><summary>Reasoning</summary>", "", m.reasoning.strip(), "", "</details>", ""]
        out += [m.content.rstrip(), ""]
    return "\n".join(out).rstrip() + "\n"
