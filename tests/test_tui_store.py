"""The conversation store: SQLite round trips, search, rewinding, export."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata_tui.commands import parse_slash
from strata_tui.screens.settings import parse_optional
from strata_tui.store import Settings, Store, StoredMessage, data_dir


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "chat.sqlite3")
    yield s
    s.close()


def test_messages_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "chat.sqlite3"
    s = Store(path)
    conv = s.create(
        "first", system_prompt="be brief", settings=Settings(temperature=0.3, seed=7, thinking=False)
    )
    s.add_message(conv.id, StoredMessage("user", "hi there"))
    s.add_message(
        conv.id, StoredMessage("assistant", "hello", reasoning="greet", meta={"finish_reason": "stop"})
    )
    s.close()

    s2 = Store(path)
    got = s2.get(conv.id)
    assert got is not None and got.title == "first" and got.system_prompt == "be brief"
    assert (got.settings.temperature, got.settings.seed, got.settings.thinking) == (0.3, 7, False)
    msgs = s2.messages(conv.id)
    assert [(m.role, m.content, m.reasoning) for m in msgs] == [
        ("user", "hi there", ""),
        ("assistant", "hello", "greet"),
    ]
    assert msgs[1].meta == {"finish_reason": "stop"}
    s2.close()


def test_list_is_most_recent_first_and_search_reads_messages(store: Store) -> None:
    a = store.create("apples")
    b = store.create("bananas")
    store.add_message(a.id, StoredMessage("user", "tell me about 100% juice"))
    assert [c.title for c in store.list()] == ["apples", "bananas"]  # a was used last
    assert [c.title for c in store.list("banana")] == ["bananas"]  # title match
    assert [c.title for c in store.list("100%")] == ["apples"]  # message text, % taken literally
    assert store.list("0_%") == []
    assert store.list("zebra") == []
    assert b.id != a.id


def test_rename_delete_and_rewind(store: Store) -> None:
    c = store.create()
    ids = [
        store.add_message(c.id, StoredMessage(r, t)).id
        for r, t in [("user", "1"), ("assistant", "2"), ("user", "3"), ("assistant", "4")]
    ]
    store.delete_messages_from(c.id, ids[2])
    assert [m.content for m in store.messages(c.id)] == ["1", "2"]
    store.rename(c.id, "renamed")
    assert store.get(c.id).title == "renamed"  # type: ignore[union-attr]
    store.delete(c.id)
    assert store.get(c.id) is None
    assert store.messages(c.id) == []  # cascade


def test_export_markdown_has_every_part(store: Store) -> None:
    c = store.create("Export me", system_prompt="You are terse.")
    store.add_message(c.id, StoredMessage("user", "What is 2+2?"))
    store.add_message(c.id, StoredMessage("assistant", "**4**", reasoning="add them"))
    md = store.export_markdown(c.id)
    assert md.startswith("# Export me\n")
    assert "## System\n\nYou are terse." in md
    assert md.index("## You\n\nWhat is 2+2?") < md.index("## Assistant")
    assert "<details><summary>Reasoning</summary>\n\nadd them" in md
    assert md.rstrip().endswith("**4**")


def test_settings_request_params() -> None:
    assert Settings(max_tokens=None, thinking=False).request_params() == {
        "chat_template_kwargs": {"enable_thinking": False}
    }
    p = Settings(temperature=0.0, top_p=0.9, max_tokens=64, seed=3).request_params()
    assert p == {
        "temperature": 0.0,
        "top_p": 0.9,
        "max_tokens": 64,
        "seed": 3,
        "chat_template_kwargs": {"enable_thinking": True},
    }


def test_data_dir_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("STRATA_DATA_DIR", str(tmp_path / "x"))
    assert data_dir() == tmp_path / "x"


def test_slash_parsing_and_values() -> None:
    assert parse_slash("/temp 0.7") == ("/temp", "0.7")
    assert parse_slash("  /NEW  my title ") == ("/new", "my title")
    assert parse_slash("hello /temp") is None
    assert parse_slash("//not a command") is None
    assert parse_optional("default", float, "temperature") is None
    assert parse_optional("0.5", float, "temperature", 0, 5) == 0.5
    with pytest.raises(ValueError, match="temperature: 'hot' is not a number"):
        parse_optional("hot", float, "temperature")
    with pytest.raises(ValueError, match="top-p: 2.0 is outside"):
        parse_optional("2", float, "top-p", 0.0, 1.0)
