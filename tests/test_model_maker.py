"""The model maker: GGUF layout and metadata, tokenizer, chat template, weights, routing, cache."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, dequantize

from strata.model import PRESETS, RoutingCollapsedError, ensure_model, make_model
from strata.model._routing import PROMPT_TEXT, expected_spread, route_file, spread
from strata.model._template import CHAT_TEMPLATE
from strata.model.cli import _gguf_tokenizer, describe

TINY = PRESETS["tiny"]


def _fields(r: GGUFReader) -> dict:
    return {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}


@pytest.fixture(scope="module")
def tiny_f32(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "f32", 0, tmp_path_factory.mktemp("m") / "tiny-f32.gguf")


@pytest.fixture(scope="module")
def tiny_q8() -> Path:
    return ensure_model("tiny", "q8_0", 0)


def test_metadata_matches_preset(tiny_q8: Path) -> None:
    f = _fields(GGUFReader(str(tiny_q8)))
    assert f["general.architecture"] == "qwen3moe"
    p = TINY
    want = {
        "qwen3moe.context_length": p.n_ctx,
        "qwen3moe.embedding_length": p.d_model,
        "qwen3moe.block_count": p.n_layer,
        "qwen3moe.feed_forward_length": p.d_ff,
        "qwen3moe.attention.head_count": p.n_head,
        "qwen3moe.attention.head_count_kv": p.n_head_kv,
        "qwen3moe.attention.key_length": p.head_dim,
        "qwen3moe.attention.value_length": p.head_dim,
        "qwen3moe.expert_count": p.n_expert,
        "qwen3moe.expert_used_count": p.n_expert_used,
        "qwen3moe.expert_feed_forward_length": p.d_ff_expert,
    }
    for k, v in want.items():
        assert f[k] == v, k
    assert f["qwen3moe.rope.freq_base"] == pytest.approx(p.rope_theta)
    assert f["qwen3moe.attention.layer_norm_rms_epsilon"] == pytest.approx(p.rms_eps)
    assert f["general.file_type"] == 7  # MOSTLY_Q8_0
    assert f["tokenizer.ggml.model"] == "gpt2"
    assert f["tokenizer.ggml.pre"] == "qwen2"
    assert f["tokenizer.chat_template"] == CHAT_TEMPLATE


def test_tensor_names_shapes_and_types(tiny_q8: Path) -> None:
    p = TINY
    D, E, F, hd = p.d_model, p.n_expert, p.d_ff_expert, p.head_dim
    want = {"token_embd.weight": (D, p.n_vocab), "output_norm.weight": (D,), "output.weight": (D, p.n_vocab)}
    for i in range(p.n_layer):
        b = f"blk.{i}."
        want |= {
            b + "attn_norm.weight": (D,),
            b + "attn_q.weight": (D, p.n_head * hd),
            b + "attn_k.weight": (D, p.n_head_kv * hd),
            b + "attn_v.weight": (D, p.n_head_kv * hd),
            b + "attn_output.weight": (p.n_head * hd, D),
            b + "attn_q_norm.weight": (hd,),
            b + "attn_k_norm.weight": (hd,),
            b + "ffn_norm.weight": (D,),
            b + "ffn_gate_inp.weight": (D, E),
            b + "ffn_gate_exps.weight": (D, F, E),
            b + "ffn_up_exps.weight": (D, F, E),
            b + "ffn_down_exps.weight": (F, D, E),
        }
    r = GGUFReader(str(tiny_q8))
    got = {t.name: tuple(int(x) for x in t.shape) for t in r.tensors}  # GGUF ne order
    assert got == want
    for t in r.tensors:
        one_d = len(t.shape) == 1 or t.name.endswith("ffn_gate_inp.weight")
        assert t.tensor_type.name == ("F32" if one_d else "Q8_0"), t.name


def test_vocabulary_is_a_valid_gpt2_vocabulary(tiny_q8: Path) -> None:
    f = _fields(GGUFReader(str(tiny_q8)))
    tokens, types, merges = (
        f["tokenizer.ggml.tokens"],
        f["tokenizer.ggml.token_type"],
        f["tokenizer.ggml.merges"],
    )
    assert len(tokens) == len(types) == TINY.n_vocab
    assert len(set(tokens)) == len(tokens)
    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        a, b = m.split(" ")
        assert a in index and b in index and a + b in index, m
    # every byte has a token (byte-level BPE), in GPT-2's printable byte alphabet
    from tokenizers import pre_tokenizers

    assert set(pre_tokenizers.ByteLevel.alphabet()) <= set(tokens)
    specials = {"<|endoftext|>": 3, "<|im_start|>": 3, "<|im_end|>": 3, "<think>": 4, "</think>": 4}
    for s, ty in specials.items():
        assert types[index[s]] == ty, s
    assert f["tokenizer.ggml.eos_token_id"] == index["<|im_end|>"]
    assert f["tokenizer.ggml.bos_token_id"] == index["<|endoftext|>"]
    assert f["tokenizer.ggml.padding_token_id"] == index["<|endoftext|>"]
    assert f["tokenizer.ggml.add_bos_token"] is False


def test_tokenizer_from_the_file_round_trips_text(tiny_q8: Path) -> None:
    tok = _gguf_tokenizer(tiny_q8)
    text = "Hello, world! def f(x):\n    return x ** 2  # ünïcødé 日本 \t tabs\n\n"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert len(ids) < len(text.encode()) * 0.8  # the merges actually merge
    chat = "<|im_start|>user\nhi<|im_end|>\n<think>\n\n</think>"
    ids = tok.encode(chat).ids
    for s in ("<|im_start|>", "<|im_end|>", "<think>", "</think>"):
        assert tok.token_to_id(s) in ids


@pytest.mark.parametrize("enable_thinking", [None, True, False])
def test_chat_template_renders_in_a_sandbox(enable_thinking: bool | None) -> None:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    kw = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    out = (
        ImmutableSandboxedEnvironment()
        .from_string(CHAT_TEMPLATE)
        .render(messages=msgs, add_generation_prompt=True, **kw)
    )
    assert out.startswith(
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
    )
    assert "<|im_start|>assistant\n4<|im_end|>\n" in out  # earlier reasoning is dropped
    assert "add them" not in out
    tail = "<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    if enable_thinking is False:
        assert out.endswith(tail + "<think>\n\n</think>\n\n")
    else:
        assert out.endswith(tail)


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    def digest(p: Path) -> str:
        return hashlib.sha256(p.read_bytes()).hexdigest()

    a = make_model("tiny", "q8_0", 5, tmp_path / "a.gguf", check=False)
    b = make_model("tiny", "q8_0", 5, tmp_path / "b.gguf", check=False)
    c = make_model("tiny", "q8_0", 6, tmp_path / "c.gguf", check=False)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)


def test_weights_do_not_collapse(tiny_f32: Path) -> None:
    r = GGUFReader(str(tiny_f32))
    t = {x.name: np.asarray(dequantize(x.data, x.tensor_type)) for x in r.tensors}
    emb = t["token_embd.weight"]
    assert 0.9 < emb[:, 1:].std() < 1.1
    for i in range(TINY.n_layer):
        for name in ("attn_output", "ffn_down_exps", "attn_q", "ffn_gate_exps"):
            w = t[f"blk.{i}.{name}.weight"]
            assert w.std() < 0.2, name
            nz = w[w != 0]
            assert 0.45 < (nz > 0).mean() < 0.55, name  # both signs
    # the hidden states of different tokens stay apart: the routed experts differ between tokens
    tokens = _gguf_tokenizer(tiny_f32).encode(PROMPT_TEXT).ids[:128]
    sel = route_file(tiny_f32, tokens)
    for s in sel:
        distinct = {tuple(sorted(row)) for row in s.tolist()}
        assert len(distinct) > len(tokens) // 2


@pytest.mark.parametrize("quant", ["f32", "q8_0"])
def test_routing_spreads_as_the_preset_says(quant: str, tiny_f32: Path, tiny_q8: Path) -> None:
    path = tiny_f32 if quant == "f32" else tiny_q8
    tokens = _gguf_tokenizer(path).encode(PROMPT_TEXT).ids[:256]
    want = expected_spread(TINY.n_expert, TINY.n_expert_used, TINY.zipf_alpha, TINY.route_noise, len(tokens))
    uniform_top1 = 1.0 / TINY.n_expert
    for s in route_file(path, tokens):
        got = spread(s, TINY.n_expert)
        assert abs(got.entropy - want.entropy) < 0.1
        assert got.top1_share > 2 * uniform_top1  # skewed, not uniform
        assert got.top1_share < 1.0 / TINY.n_expert_used  # not one expert for every token
        assert got.coverage > 0.8


def test_a_collapsed_model_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "collapsed.gguf"
    # the known trap: small embeddings let one shared direction dominate every hidden state
    with pytest.raises(RoutingCollapsedError, match="collapsed"):
        make_model("tiny", "f32", 0, out, embd_std=0.02, n_layer=2)
    assert not out.exists()
    assert not list(tmp_path.glob("*.part"))


def test_ensure_model_is_safe_under_concurrency(tmp_path: Path) -> None:
    env = dict(os.environ, STRATA_CACHE_DIR=str(tmp_path))
    code = "from strata.model import ensure_model; print(ensure_model('tiny', 'q8_0', 3))"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1].decode()[-2000:] for o in outs]
    paths = {o[0].decode().strip() for o in outs}
    assert len(paths) == 1
    path = Path(paths.pop())
    assert path.parent.parent == tmp_path
    assert len(GGUFReader(str(path)).tensors) == len(list(GGUFReader(str(tiny_q8_path(tmp_path))).tensors))
    assert not list(path.parent.glob("*.part"))
    # made from scratch there (tokenizer trained anew): the same bytes as made here
    here = make_model("tiny", "q8_0", 3, tmp_path / "here.gguf", check=False)
    assert hashlib.sha256(here.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()


def tiny_q8_path(cache: Path) -> Path:
    return next((cache / "models").glob("tiny-q8_0-seed3-*.gguf"))


def test_bad_arguments_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset 'huge'; choose one of: tiny"):
        make_model("huge", "f32", 0, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="unknown quant 'q9_9'"):
        make_model("tiny", "q9_9", 0, tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="head_count 4 is not a multiple of head_count_kv 3"):
        make_model("tiny", "f32", 0, tmp_path / "x.gguf", n_head_kv=3)


def test_k_quants_follow_llama_cpps_mix(tmp_path: Path) -> None:
    path = make_model("small", "q4_k_m", 0, tmp_path / "x.gguf", n_layer=2, n_vocab=1024)
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q4_K"
    # With 2 layers, llama.cpp's use_more_bits picks the last layer (i >= 7n/8) but not the first.
    assert types["blk.0.ffn_down_exps.weight"] == "Q4_K"
    assert types["blk.1.ffn_down_exps.weight"] == "Q6_K"
    assert types["output.weight"] == "Q6_K"
    assert types["blk.0.ffn_gate_inp.weight"] == "F32"
    # tiny's rows of 128 and 64 values cannot hold 256-wide K blocks: llama.cpp's fallbacks
    tiny = make_model("tiny", "q4_k_m", 0, tmp_path / "t.gguf", n_layer=2)
    types = {t.name: t.tensor_type.name for t in GGUFReader(str(tiny)).tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == "Q5_0"  # Q4_K -> Q5_0
    assert types["output.weight"] == "Q8_0"  # Q6_K -> Q8_0


def test_model_info_reports_types_and_expert_bytes(tiny_q8: Path) -> None:
    d = describe(tiny_q8)
    assert d["architecture"] == "qwen3moe"
    assert d["dimensions"]["expert_count"] == TINY.n_expert
    # one expert: gate + up + down of D x F each, at Q8_0's 34 bytes per 32 weights
    per = 3 * TINY.d_model * TINY.d_ff_expert // 32 * 34
    assert d["expert_bytes_per_layer"] == [per] * TINY.n_layer
    assert d["resident_bytes"] + per * TINY.n_expert * TINY.n_layer == tiny_q8.stat().st_size - _data_offset(
        tiny_q8
    )
    out = subprocess.run(
        [sys.executable, "-m", "strata.cli", "model", "info", str(tiny_q8)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "blk.3.ffn_down_exps.weight" in out and "Q8_0" in out and "one expert" in out


def _data_offset(path: Path) -> int:
    return int(GGUFReader(str(path)).data_offset)


def test_model_info_rejects_a_file_that_is_not_gguf(tmp_path: Path) -> None:
    bad = tmp_path / "not.gguf"
    bad.write_bytes(b"hello world, not a model")
    r = subprocess.run(
        [sys.executable, "-m", "strata.cli", "model", "info", str(bad)], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert "cannot read" in r.stderr and "not a readable GGUF file" in r.stderr
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(ensure_model("tiny", "q8_0", 0).read_bytes()[:300_000])  # header intact, data cut
    r = subprocess.run(
        [sys.executable, "-m", "strata.cli", "model", "info", str(cut)], capture_output=True, text=True
    )
    assert r.returncode == 1 and "truncated or corrupt" in r.stderr


def test_maker_routing_equals_the_reference_routing(tiny_f32: Path) -> None:
    from reference import Reference

    tokens = _gguf_tokenizer(tiny_f32).encode(PROMPT_TEXT).ids[:96]
    ref = Reference(tiny_f32, kv_dtype=None)
    ref.forward(tokens)
    for layer, sel in enumerate(route_file(tiny_f32, tokens)):
        same = (np.sort(sel, axis=1) == np.sort(ref.routing[0][layer], axis=1)).all(axis=1)
        assert same.mean() > 0.98, f"layer {layer}: {same.mean():.3f} of tokens route the same"


def test_pooled_writing_keeps_layout_and_routing(tmp_path: Path) -> None:
    # the fast path of the qwen3-30b-a3b preset, at tiny dimensions
    path = make_model("tiny", "q8_0", 0, tmp_path / "pooled.gguf", pooled=True)
    r = GGUFReader(str(path))
    t = {x.name: x for x in r.tensors}
    ref = {x.name: x for x in GGUFReader(str(ensure_model("tiny", "q8_0", 0))).tensors}
    assert {n: (x.tensor_type, tuple(x.shape)) for n, x in t.items()} == {
        n: (x.tensor_type, tuple(x.shape)) for n, x in ref.items()
    }
    down = dequantize(t["blk.0.ffn_down_exps.weight"].data, t["blk.0.ffn_down_exps.weight"].tensor_type)
    assert (down[:, 0, :] == 0).all() and down[:, 1:, :].std() > 0
    emb = dequantize(t["token_embd.weight"].data, t["token_embd.weight"].tensor_type)
    assert np.allclose(emb[:, 0], 1.0, atol=0.03)  # Q8_0 steps are max|block| / 127
    assert len({row.tobytes() for row in emb[:512]}) > 500  # tokens keep distinct embeddings


def test_write_weights_checks_names_and_shapes(tmp_path: Path) -> None:
    from strata.model import tensor_specs, write_weights

    p = TINY.with_overrides(n_layer=1)
    weights = {n: np.zeros(s, np.float32) for n, s in tensor_specs(p)}
    weights["blk.0.attn_q.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match="attn_q"):
        write_weights(tmp_path / "w.gguf", p, weights)
    assert not (tmp_path / "w.gguf").exists()


def test_cli_make_writes_the_file_and_prints_its_path(tmp_path: Path) -> None:
    out = tmp_path / "m.gguf"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "strata.cli",
            "model",
            "make",
            "--quant",
            "f16",
            "--seed",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    assert "layer  3: top-1 share" in r.stderr
    assert {t.tensor_type.name for t in GGUFReader(str(out)).tensors} == {"F32", "F16"}
    r = subprocess.run(
        [sys.executable, "-m", "strata.cli", "model", "make", "--preset", "nope"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "invalid choice: 'nope'" in r.stderr


def test_the_skew_sets_the_lru_hit_rate(tmp_path: Path, tiny_f32: Path) -> None:
    from strata.model._routing import lru_hit_rates

    uniform = make_model("tiny", "f32", 0, tmp_path / "uniform.gguf", zipf_alpha=0.0)
    tokens = _gguf_tokenizer(tiny_f32).encode(PROMPT_TEXT * 3).ids[:600]
    sel_u = route_file(uniform, tokens)
    sel_s = route_file(tiny_f32, tokens)
    for s in sel_u:
        assert spread(s, TINY.n_expert).entropy > 0.95
    hit_u = lru_hit_rates(sel_u, TINY.n_expert, [0.5])[0.5]
    hit_s = lru_hit_rates(sel_s, TINY.n_expert, [0.5])[0.5]
    assert abs(hit_u - 0.5) < 0.08  # uniform routing: the hit rate is about the cache share
    assert hit_s > hit_u + 0.12  # the default skew makes a cache of half the experts hit far more often
    # the LRU simulation itself: a sequence that cycles through 3 experts always hits a cache of 3
    cyc = [np.array([[i % 3] for i in range(30)])]
    assert lru_hit_rates(cyc, 10, [0.3])[0.3] == pytest.approx(27 / 30)
    assert lru_hit_rates(cyc, 10, [0.2])[0.2] == 0.0  # 2 slots, 3 experts in a cycle: LRU always misses
