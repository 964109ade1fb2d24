"""Verdicts on recorded runs (records written by hand in the format _cell records)."""

from __future__ import annotations

from repro_matrix import first_difference, judge


def _ok(k, tokens, margins=None, halvings=0):
    return {
        "prompt": k,
        "status": "ok",
        "tokens": tokens,
        "margins": margins or [5.0] * len(tokens),
        "halvings": halvings,
    }


def _err(k, code, msg="", exit_code=None):
    return {"prompt": k, "status": "error", "error_code": code, "error_message": msg, "exit_code": exit_code}


def _rec(cid, *starts, reference=False):
    return {
        "cell_id": cid,
        "cell": {"engine": {}, "request": {}, "reference": reference},
        "starts": [
            {"start": i, "start_error": None, "requests": list(reqs)} for i, reqs in enumerate(starts)
        ],
    }


REF = _rec("ref", [_ok(0, [1, 2, 3, 4], [9.0, 0.0004, 3.0, 2.0]), _ok(1, [5, 6, 7])], reference=True)


def test_equal_replies_are_ok():
    v = judge(_rec("a", [_ok(0, [1, 2, 3, 4]), _ok(1, [5, 6, 7])]), REF)
    assert v.label == "ok" and not v.failing and v.difference is None


def test_reply_differs_names_position_tokens_and_near_tie():
    # differs at position 1, where the reference's margin (0.0004) is below the threshold
    v = judge(_rec("a", [_ok(0, [1, 9, 3, 4]), _ok(1, [5, 6, 7])]), REF, near_tie=1e-3)
    assert v.label == "reply differs" and v.failing
    d = v.difference
    assert (d.prompt, d.position, d.token, d.ref_token) == (0, 1, 9, 2)
    assert d.near_tie and "near-tie" in v.detail
    # the same difference with a smaller threshold is not a near-tie
    v2 = judge(_rec("a", [_ok(0, [1, 9, 3, 4]), _ok(1, [5, 6, 7])]), REF, near_tie=1e-4)
    assert not v2.difference.near_tie and "near-tie" not in v2.detail
    # at a position with a clear margin it is never one
    v3 = judge(_rec("a", [_ok(0, [1, 2, 8, 4]), _ok(1, [5, 6, 7])]), REF, near_tie=1e-3)
    assert v3.difference.position == 2 and not v3.difference.near_tie


def test_a_reply_that_ends_early_differs_at_its_end():
    d = first_difference([1, 2], [1, 2, 3], [1.0, 1.0, 1.0], prompt=0, near_tie=1e-3)
    assert d.position == 2 and d.token is None and d.ref_token == 3
    assert first_difference([1, 2], [1, 2], [1.0, 1.0], prompt=0, near_tie=1e-3) is None


def test_lend_failures_and_exits_are_counted_per_start():
    rec = _rec(
        "legacy",
        [_ok(0, [1, 2, 3, 4]), _err(1, "lend_failed", "lending the prompt path its slots failed: ...")],
        [
            _ok(0, [1, 2, 3, 4]),
            _err(1, "engine_exited", "the engine stopped unexpectedly (exit code 134)", 134),
        ],
        [_ok(0, [1, 2, 3, 4]), _ok(1, [5, 6, 7])],
    )
    v = judge(rec, REF)
    assert v.label == "engine exited" and v.failing
    assert v.labels == ["engine exited", "lend failed"]
    assert v.exits == 1 and v.lend_failures == 1 and v.exit_codes == [134]
    assert "engine exits, 1 of 3 starts (exit code 134)" in v.detail
    assert "lend failed, 1 of 3 starts (prompt 1)" in v.detail
    assert any("lending the prompt path" in e for e in v.errors)


def test_engine_exits_on_every_start():
    rec = _rec("x", *[[_err(0, "engine_exited", "... (exit code 1)", 1)] for _ in range(3)])
    v = judge(rec, REF)
    assert "engine exits, 3 of 3 starts" in v.detail


def test_replies_that_change_between_starts_are_nondeterministic():
    rec = _rec("n", [_ok(0, [1, 2, 3, 4])], [_ok(0, [1, 2, 5, 4])])
    v = judge(rec, REF)
    assert "nondeterministic" in v.labels
    assert v.nondeterministic.position == 2


def test_halving_is_reported_but_not_a_failure():
    v = judge(_rec("h", [_ok(0, [1, 2, 3, 4], halvings=1), _ok(1, [5, 6, 7])]), REF)
    assert v.label == "halved" and not v.failing


def test_an_engine_that_never_starts():
    rec = {
        "cell_id": "s",
        "cell": {},
        "starts": [{"start": 0, "start_error": "budget too small: 3 MiB missing", "requests": []}],
    }
    v = judge(rec, REF)
    assert v.label == "engine start failed" and v.failing and "budget too small" in v.errors[0]


def test_fail_on_decides_what_fails():
    rec = _rec("a", [_ok(0, [1, 9, 3, 4]), _ok(1, [5, 6, 7])])
    assert not judge(rec, REF, fail_on=("lend failed",)).failing
