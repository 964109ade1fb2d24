"""Scrubbing: planted homes, users, hosts, keys and addresses never reach the report."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from repro_matrix import Scrubber

PLANTED_LOG = """\
strata: listening on http://10.20.30.40:8080 (host build-box-7.corp.example)
loading /home/al/models/qwen3-30b-a3b-Q4_K_M.gguf for alice on build-box-7
cache dir /home/alice/.cache/strata and /home/al; also /Users/bob/Downloads/x.gguf
working copy /data/home/al/strata (not a home, but it contains one)
OPENAI_API_KEY=sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c
HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345
Authorization: Bearer abc.def-1234567890TOKENVALUE
strata serve --api-key s3cr3t-key-value --port 8080
{"api_key": "quoted-secret-99"} github ghp_0123456789abcdefghijABCDEFGHIJ012345
peer fe80::1ff:fe23:4567:890a and 2001:db8:85a3::8a2e:370:7334, mail alice.smith@example.org
ssh alice@build-box-7 from 192.168.1.23; /root/.bashrc
kept: 127.0.0.1, time 14:52:47, version 1.2.3, commit 9861c794dd6d0123456789abcdef0123456789ab
proxy http://bob:pa55word@10.0.0.1/ and git+https://deploy-user@git.example.net/x.git
model C:\\Users\\carol\\models\\m.gguf and d:/Users/dave/strata, but C:\\Users\\Public stays
"""

SECRETS = [
    "10.20.30.40",
    "build-box-7",
    "/home/al",
    "alice",
    "/home/alice",
    "/Users/bob",
    "bob",
    "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "abc.def-1234567890TOKENVALUE",
    "s3cr3t-key-value",
    "quoted-secret-99",
    "ghp_0123456789abcdefghijABCDEFGHIJ012345",
    "fe80::1ff:fe23:4567:890a",
    "2001:db8:85a3::8a2e:370:7334",
    "alice.smith@example.org",
    "192.168.1.23",
    "/root",
    "corp.example",
    "pa55word",
    "10.0.0.1",
    "deploy-user",
    "carol",
    "dave",
]


def _scrubber() -> Scrubber:
    return Scrubber(
        homes=["/home/al", "/home/alice"],
        users=["al", "alice"],
        hosts=["build-box-7.corp.example", "build-box-7"],
    )


def test_nothing_planted_survives():
    clean, removed = _scrubber().scrub(PLANTED_LOG)
    for s in SECRETS:
        assert s not in clean, f"{s!r} survived:\n{clean}"
    kinds = {r.kind for r in removed}
    assert kinds == {"home", "key", "ip", "email", "user", "host"}
    # what is not private stays
    for kept in (
        "127.0.0.1",
        "14:52:47",
        "1.2.3",
        "9861c794dd6d0123456789abcdef0123456789ab",
        "qwen3-30b-a3b",
    ):
        assert kept in clean


def test_a_home_that_prefixes_another_is_not_half_replaced():
    clean, _ = _scrubber().scrub("a /home/al/x b /home/alice/y c /home/albert/z d /home/al.")
    # /home/alice is replaced whole (never "<home>ice"), and /home/albert (nobody's home we know) too
    assert "<home>ice" not in clean and "<home>bert" not in clean
    assert clean == "a <home>/x b <home>/y c <home>/z d <home>."
    # a path that contains a home further in is not a home
    clean2, _ = _scrubber().scrub("/data/home/al/strata")
    assert "/data/home/" in clean2 and "/home/al/" not in clean2.replace("/data/home/", "")


def test_user_shown_what_was_removed():
    _, removed = _scrubber().scrub(PLANTED_LOG)
    by = {(r.kind, r.original) for r in removed}
    assert ("home", "/home/alice") in by and ("home", "/home/al") in by
    assert ("ip", "10.20.30.40") in by and ("host", "build-box-7") in by
    assert all(r.count >= 1 for r in removed)


def test_report_of_a_run_with_planted_logs_is_scrubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The report writer scrubs what it takes from records (messages, log tails, paths)."""
    from repro_matrix._report import write_report

    monkeypatch.setenv("MY_SERVICE_TOKEN", "tok-ABCDEFGH12345678")
    out = tmp_path / "run"
    out.mkdir()
    (out / "matrix.json").write_text(
        json.dumps({"name": "t", "model": "/home/alice/m/tiny.gguf", "axes": {"expert_cache": [40, 48]}})
    )
    (out / "env.json").write_text(
        json.dumps(
            {
                "python": {"version": "3.11", "executable": "/home/alice/venv/bin/python"},
                "os": {"kernel": "6.1"},
            }
        )
    )
    recs = []
    for i, ec in enumerate(("40", "48")):
        failing = i == 1
        req = (
            {
                "prompt": 0,
                "status": "error",
                "error_code": "engine_exited",
                "http_status": 500,
                "error_message": "the engine stopped unexpectedly (exit code 134) at /home/al/strata/x.c on "
                "build-box-7 10.20.30.40 key tok-ABCDEFGH12345678",
            }
            if failing
            else {"prompt": 0, "status": "ok", "tokens": [1], "margins": [1.0]}
        )
        recs.append(
            {
                "cell_id": f"c{i}",
                "cell": {
                    "engine": {"expert_cache": ec},
                    "request": {
                        "temperature": 0.0,
                        "seed": 0,
                        "top_k": 0,
                        "top_p": 1.0,
                        "min_p": 0.0,
                        "max_tokens": 1,
                    },
                },
                "model": "/home/alice/m/tiny.gguf",
                "model_spec": "/home/alice/m/tiny.gguf",
                "prompts": [{"index": 0, "length": 100, "chunk": None}],
                "starts": [
                    {
                        "start": 0,
                        "requests": [req],
                        "log_tail": "alice@build-box-7 /home/alice sk-" + "x" * 30,
                    }
                ],
            }
        )
    (out / "cells.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    path, text, removed = write_report(
        out,
        scrubber=Scrubber.for_this_machine(
            extra_homes=["/home/al", "/home/alice"], extra_users=["alice"], extra_hosts=["build-box-7"]
        ),
    )
    saved = path.read_text()
    assert saved == text and "engine exits, 1 of 1 starts (exit code 134)" in saved
    for s in (
        "/home/al",
        "alice",
        "build-box-7",
        "10.20.30.40",
        "tok-ABCDEFGH12345678",
        "sk-xxxx",
        os.path.expanduser("~") + "/",
    ):
        assert s not in saved, f"{s!r} survived"
    assert {r.kind for r in removed} >= {"home", "user", "host", "ip", "key"}


def test_url_credentials_and_windows_homes():
    clean, removed = Scrubber().scrub(
        "http://bob:pa55word@10.0.0.1/ x C:\\Users\\carol\\m.gguf y C:\\Users\\Public\\z"
    )
    assert clean == "http://<user>:<secret>@<ip>/ x <home>\\m.gguf y C:\\Users\\Public\\z", clean
    assert {("user", "bob"), ("key", "pa55word"), ("home", "C:\\Users\\carol")} <= {
        (r.kind, r.original) for r in removed
    }


def test_macos_homes_through_their_volumes_and_tilde_paths():
    text = (
        "/System/Volumes/Data/Users/frank/m.gguf, /Volumes/Macintosh HD/Users/gina/x and ~hank/.cache; "
        "/Users/Shared/models stays, and so do ~/x and 'about ~half of it'"
    )
    clean, removed = Scrubber().scrub(text)
    for name in ("frank", "gina", "hank"):
        assert name not in clean, clean
    assert clean.startswith("<home>/m.gguf, <home>/x and <home>/.cache;")
    assert "/Users/Shared/models" in clean and "~/x" in clean and "~half of" in clean
    assert {r.original for r in removed if r.kind == "home"} == {
        "/System/Volumes/Data/Users/frank",
        "/Volumes/Macintosh HD/Users/gina",
        "~hank",
    }


def test_this_machines_names_in_any_case():
    import platform
    import socket

    from repro_matrix._scrub import _GENERIC_NAMES, _machine_names

    names = _machine_names()
    assert socket.gethostname() in names and platform.node() in names
    host = socket.gethostname().split(".")[0]
    if host.lower() in _GENERIC_NAMES or len(host) < 2:
        pytest.skip(f"this machine's name {host!r} is too common to scrub")
    text = f"ssh {host} and {host.upper()}.local, {host.lower()}-worker stays one word"
    clean, _ = Scrubber.for_this_machine().scrub(text)
    assert clean.startswith("ssh <host> and <host>.local, ") and f"{host.lower()}-worker" in clean
