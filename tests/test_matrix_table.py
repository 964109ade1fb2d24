"""Tables and the environment section, from records written by hand in the recorded format."""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys

import pandas as pd

from repro_matrix import Cell, Matrix
from repro_matrix._table import _ranges, build_table, markdown_table, summarize


def _record(cell: Cell, *, fail: bool, slots: int) -> dict:
    req = (
        {
            "prompt": 0,
            "status": "error",
            "error_code": "lend_failed",
            "error_message": "lending the prompt path its slots failed: prefill: ...",
        }
        if fail
        else {"prompt": 0, "status": "ok", "tokens": [3, 1, 4], "margins": [2.0, 2.0, 2.0]}
    )
    return {
        "cell_id": cell.cell_id,
        "cell": cell.to_dict(),
        "plan": {
            "n_slots": slots,
            "auto_chunk": 4096,
            "auto_ring_slots": 32,
            "auto_loan_slots": 1338,
            "max_lend_slots": slots // 2,
        },
        "layouts": {
            "layouts": {
                "2048": {"slots_needed": 1935, "ring_slots": 1286},
                "4096": {"slots_needed": 1338, "ring_slots": 32},
            }
        },
        "prompts": [{"index": 0, "length": 2008, "chunk": 2048}],
        "starts": [{"start": i, "requests": [req]} for i in range(3)],
    }


def _matrix() -> Matrix:
    return Matrix.from_dict(
        {
            "axes": {"expert_cache": [3840, 4352, 4864, 5376], "lend_policy": ["legacy", "current"]},
            "reference": {"lend_policy": "current", "expert_cache": "auto"},
            "expect_fail": [{"lend_policy": "legacy"}],
        }
    )


def _records(m: Matrix) -> list[dict]:
    recs = []
    for c in m.cells():
        ec = c.knob("expert_cache")
        fail = c.knob("lend_policy") == "legacy" and ec in ("4352", "4864")
        recs.append(_record(c, fail=fail, slots=int(ec) if ec.isdigit() else 6000))
    return recs


def test_table_groups_by_cache_size_and_names_policy_and_verdict():
    m = _matrix()
    df = build_table(_records(m), m)
    assert list(df["cell"])[0] == "reference"
    body = df[df["cell"] != "reference"]
    # grouped by cache size, legacy before current as declared
    assert list(body["expert_cache"]) == ["3840", "3840", "4352", "4352", "4864", "4864", "5376", "5376"]
    assert list(body["lend_policy"])[:2] == ["legacy", "current"]
    failing = body[body["failing"]]
    assert set(failing["expert_cache"]) == {"4352", "4864"} and set(failing["lend_policy"]) == {"legacy"}
    assert (
        all(failing["expected"])
        and (failing["what happened"] == "lend failed, 3 of 3 starts (prompt 0)").all()
    )
    assert (body["short chunk needs"] == "2048: 1935 (ring 1286)").all()
    md = markdown_table(df)
    head = md.splitlines()[0]
    assert "lend policy" in head and "verdict" in head and "short chunk needs" in head
    # a cache size is written once per group
    rows = md.splitlines()[2:]
    assert rows[1].startswith("| 3840 |") and rows[2].startswith("|  |")
    assert "auto (reference)" in rows[0]
    # the CSV round-trips through pandas
    buf = io.StringIO()
    df.to_csv(buf, index=False)
    back = pd.read_csv(io.StringIO(buf.getvalue()))
    assert len(back) == len(df) and "verdict" in back.columns


def test_summary_names_the_failing_range_over_sampled_sizes():
    m = _matrix()
    s = summarize(build_table(_records(m), m))
    assert "lend_policy=legacy: 2 of 4 cells fail (2 lend failed) at expert_cache 4352..4864" in s
    assert "lend_policy=current: all 4 cells pass" in s


def test_ranges():
    assert _ranges([1, 2, 3, 7]) == "1..3, 7"
    assert _ranges([60, 70, 80], [50, 60, 70, 80, 90]) == "60..80"
    assert _ranges([60, 80], [50, 60, 70, 80, 90]) == "60, 80"


def test_env_command_prints_the_setup_scrubbed():
    p = subprocess.run(
        [sys.executable, "-m", "repro_matrix", "env"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    for part in ("**strata**", "**GPU**", "**CPU**", "**RAM**", "**OS**", "**Python**"):
        assert part in p.stdout
    assert platform.python_version() in p.stdout
    assert ", libstrata " in p.stdout.splitlines()[0]
    home = os.path.expanduser("~")
    assert home == "/" or home + "/" not in p.stdout


def test_the_environment_names_the_native_library_it_loaded():
    from repro_matrix._env import collect_env, env_markdown
    from strata import _cdefs

    env = collect_env()
    want = _cdefs.strata_version().decode()
    assert want and env["strata"]["library"] == want
    assert f", libstrata {want}" in env_markdown(env).splitlines()[0]
    # a library that could not be loaded is said, with the loader's reason, not left out silently
    env["strata"].update(library=None, library_error="LibraryNotFoundError: libstrata.so could not be loaded")
    assert "libstrata not loaded (LibraryNotFoundError" in env_markdown(env)
