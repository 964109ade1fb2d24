"""Writing synthetic ``qwen3moe`` GGUF files with gguf-py's GGUFWriter, and the model cache.

Tensor infos are declared first and tensor data is then streamed one tensor at a time, so even the
``qwen3-30b-a3b`` preset never holds more than one tensor in memory. Quantization: F32, F16, BF16,
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and MXFP4 through gguf-py; the K- and i-quants through ``strata.model.quants``.
Norm weights and the router (``ffn_gate_inp``) stay F32, as in llama.cpp's quantized files.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import quants
from ._cache import atomic_path, cache_dir, file_lock
from ._presets import (
    DEEPSEEK2_MLA,
    GLM4MOE_DENSE_LEAD,
    GLM4MOE_ROUTED_SCALE,
    GRANITE_SCALES,
    Preset,
    get_preset,
)
from ._routing import PROMPT_TEXT, LayerSpread, expected_spread, route_file, spread
from ._template import CHAT_TEMPLATE
from ._tokenizer import build_vocab
from ._weights import ANCHOR, WeightGen, stream_rng, tensor_specs

__all__ = [
    "BASE_QUANTS",
    "MAKER_VERSION",
    "QUANTS",
    "RoutingCollapsedError",
    "ensure_model",
    "make_model",
    "model_cache_path",
    "quantize",
    "tensor_types",
    "write_weights",
]

# Bump when the bytes a (preset, quant, seed) makes change: cached files are keyed by it.
MAKER_VERSION = 2

log = logging.getLogger("strata.model")


def _T(name: str):  # type: ignore[no-untyped-def]
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[name]


# quant name -> (ggml type name, general.file_type)
BASE_QUANTS: dict[str, tuple[str, int]] = {
    "f32": ("F32", 0),
    "f16": ("F16", 1),
    "bf16": ("BF16", 32),
    "q8_0": ("Q8_0", 7),
    "q4_0": ("Q4_0", 2),
    "q4_1": ("Q4_1", 3),
    "q5_0": ("Q5_0", 8),
    "q5_1": ("Q5_1", 9),
    "q2_k": ("Q2_K", 10),
    "q3_k": ("Q3_K", 12),
    "q4_k": ("Q4_K", 15),
    "q5_k": ("Q5_K", 17),
    "q6_k": ("Q6_K", 18),
    "iq4_nl": ("IQ4_NL", 25),
    "iq4_xs": ("IQ4_XS", 30),
    "iq3_xxs": ("IQ3_XXS", 23),
    "iq3_s": ("IQ3_S", 26),
    "iq2_xs": ("IQ2_XS", 20),
}
# the mixes (q4_k_m ...) and which type each tensor gets in them: strata.model.quants, the one place
QUANTS = sorted({*BASE_QUANTS, *quants.MIXES})

_GGUF_PY_QUANTIZES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"}


class RoutingCollapsedError(RuntimeError):
    """The made model routes most tokens to the same few experts; the file was not published."""


def _check_quant(quant: str) -> str:
    q = quant.lower()
    if q not in QUANTS:
        raise ValueError(f"unknown quant {quant!r}; choose one of: {', '.join(QUANTS)}")
    return q


def tensor_types(p: Preset, quant: str) -> dict[str, str]:
    """The ggml type name of every tensor of a model made with ``quant``."""

    q = _check_quant(quant)
    mix = quants.MIXES.get(q)
    out: dict[str, str] = {}
    for name, shape in tensor_specs(p):
        if len(shape) == 1 or name.endswith(("ffn_gate_inp.weight", "ffn_gate_inp_shexp.weight")):
            out[name] = "F32"
            continue
        if mix is not None:
            layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
            t = mix(
                name, layer, p.n_layer, n_expert=p.n_expert, n_gqa=p.n_head // p.n_head_kv, cols=shape[-1]
            )
        else:
            t = BASE_QUANTS[q][0]
        # a row that is not a whole number of the type's blocks falls back, as llama.cpp's quantizer does
        out[name] = quants.fallback_type(t, shape[-1])
    return out


def quantize(a: np.ndarray, type_name: str) -> np.ndarray:
    """Quantize float32 rows to ``type_name``; returns uint8 ``[..., bytes_per_row]``."""
    from gguf import GGML_QUANT_SIZES
    from gguf import quants as gq

    qt = _T(type_name)
    a = np.ascontiguousarray(a, dtype=np.float32)
    if type_name in _GGUF_PY_QUANTIZES:
        raw = gq.quantize(a, qt)
    else:
        raw = quants.quantize(a, qt)
    bs, ts = GGML_QUANT_SIZES[qt]
    row_bytes = a.shape[-1] // bs * ts
    buf = np.frombuffer(raw, dtype=np.uint8) if isinstance(raw, (bytes, bytearray)) else np.asarray(raw)
    return np.ascontiguousarray(buf).view(np.uint8).reshape(*a.shape[:-1], row_bytes)


class _Pools:
    """Pre-quantized random rows, reused to assemble huge tensors quickly (``Preset.pooled``)."""

    ROWS = 4096
    EMBD_ROWS = 16384
    RUN = 16

    def __init__(self, gen: WeightGen) -> None:
        self.gen = gen
        self.pools: dict[tuple[str, int, str], np.ndarray] = {}
        self.zero: dict[tuple[int, str], np.ndarray] = {}

    def rows(self, name: str, shape: tuple[int, ...], type_name: str) -> np.ndarray:
        kind = self.gen.kind(name)
        key = (kind, shape[-1], type_name)
        if key not in self.pools:
            n = self.EMBD_ROWS if kind == "token_embd" else self.ROWS
            rng = stream_rng(self.gen.seed, "pool", *key)
            f = WeightGen.normal(rng, (n, shape[-1]), self.gen.std(kind))
            if kind == "token_embd":
                f[:, 0] = ANCHOR
            self.pools[key] = quantize(f, type_name)
        pool = self.pools[key]
        # Runs of RUN consecutive pool rows at random offsets: memcpy-speed copies, no row gather.
        n_rows = math.prod(shape[:-1])
        out = np.empty((n_rows, pool.shape[-1]), np.uint8)
        starts = stream_rng(self.gen.seed, "rows", name).integers(
            0, len(pool) - self.RUN + 1, size=-(-n_rows // self.RUN)
        )
        for i, s0 in enumerate(starts.tolist()):
            dst = out[i * self.RUN : (i + 1) * self.RUN]
            dst[:] = pool[s0 : s0 + len(dst)]
        out = out.reshape(*shape[:-1], pool.shape[-1])
        if kind in ("attn_output", "ffn_down_exps"):
            zk = (shape[-1], type_name)
            if zk not in self.zero:
                self.zero[zk] = quantize(np.zeros((1, shape[-1]), np.float32), type_name)[0]
            out[..., 0, :] = self.zero[zk]
        return out


def _metadata(w, p: Preset, quant: str, seed: int) -> None:  # type: ignore[no-untyped-def]
    q = _check_quant(quant)
    file_type = BASE_QUANTS[q][1] if q in BASE_QUANTS else quants.FILE_TYPES[q][0]
    w.add_type("model")
    w.add_name(f"strata synthetic {p.name}")
    w.add_file_type(file_type)
    if q not in ("f32", "f16", "bf16"):
        w.add_quantization_version(2)
    w.add_context_length(p.n_ctx)
    w.add_embedding_length(p.d_model)
    w.add_block_count(p.n_layer)
    w.add_feed_forward_length(p.d_ff)
    w.add_head_count(p.n_head)
    w.add_head_count_kv(p.n_head_kv)
    if p.family == "deepseek2":  # the cache's view (one KV head of the latent and k_pe), then the heads'
        Lk, R = DEEPSEEK2_MLA["kv_lora_rank"], DEEPSEEK2_MLA["qk_rope_head_dim"]
        w.add_key_length(Lk + R)
        w.add_value_length(Lk)
        w.add_key_length_mla(p.head_dim + R)
        w.add_value_length_mla(p.head_dim)
        w.add_q_lora_rank(DEEPSEEK2_MLA["q_lora_rank"])
        w.add_kv_lora_rank(Lk)
    else:
        w.add_key_length(p.head_dim)
        w.add_value_length(p.head_dim)
    w.add_rope_freq_base(p.rope_theta)
    w.add_layer_norm_rms_eps(p.rms_eps)
    w.add_expert_count(p.n_expert)
    w.add_expert_used_count(p.n_expert_used)
    w.add_expert_feed_forward_length(p.d_ff_expert)
    if p.family == "qwen2moe":
        w.add_expert_shared_feed_forward_length(p.d_ff_shared)
    if p.family in ("llama", "granitemoe"):  # as llama.cpp's converter writes these families
        w.add_vocab_size(p.n_vocab)
        w.add_rope_dimension_count(p.head_dim)
    if p.family == "glm4moe":  # as llama.cpp's converter writes GLM-4.5's
        w.add_rope_dimension_count(p.head_dim // 2)
        w.add_expert_group_count(1)
        w.add_expert_group_used_count(1)
        w.add_expert_shared_count(1)
        w.add_leading_dense_block_count(GLM4MOE_DENSE_LEAD)
        w.add_uint32("glm4moe.expert_gating_func", 2)  # sigmoid
        w.add_expert_weights_scale(GLM4MOE_ROUTED_SCALE)
        w.add_expert_weights_norm(True)
        w.add_uint32("glm4moe.nextn_predict_layers", 0)
    if p.family == "deepseek2":  # as llama.cpp's converter writes DeepSeek V3's
        w.add_vocab_size(p.n_vocab)
        w.add_rope_dimension_count(DEEPSEEK2_MLA["qk_rope_head_dim"])
        w.add_expert_group_count(1)
        w.add_expert_group_used_count(1)
        w.add_expert_shared_count(1)
        w.add_leading_dense_block_count(GLM4MOE_DENSE_LEAD)
        w.add_uint32("deepseek2.expert_gating_func", 2)  # sigmoid
        w.add_expert_weights_scale(GLM4MOE_ROUTED_SCALE)
        w.add_expert_weights_norm(True)
    if p.family == "granitemoe":
        for key, value in GRANITE_SCALES.items():
            w.add_float32(f"granitemoe.{key}", value)
    # How this file was made (readers ignore keys they do not know).
    w.add_string("strata.maker.preset", p.name)
    w.add_uint32("strata.maker.version", MAKER_VERSION)
    w.add_uint32("strata.maker.seed", seed)
    w.add_float32("strata.maker.zipf_alpha", p.zipf_alpha)
    w.add_float32("strata.maker.route_noise", p.route_noise)

    v = build_vocab(p.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(v.tokens)
    w.add_token_types(v.token_types)
    w.add_token_merges(v.merges)
    w.add_bos_token_id(v.bos_id)
    w.add_eos_token_id(v.eos_id)
    w.add_pad_token_id(v.pad_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


# progress(tensors written, tensors, bytes written, bytes): called once before the first tensor and
# after each one (the 30B preset writes 16 GB: minutes with nothing else to show)
Progress = Callable[[int, int, int, int], None]


def _write(
    path: Path,
    p: Preset,
    quant: str,
    seed: int,
    weights: dict[str, np.ndarray] | None = None,
    progress: Progress | None = None,
) -> None:
    from gguf import GGML_QUANT_SIZES, GGUFWriter

    specs = tensor_specs(p)
    if weights is not None:
        want = {n: s for n, s in specs}
        got = {n: tuple(a.shape) for n, a in weights.items()}
        if got != want:
            diff = sorted(set(got.items()) ^ set(want.items()))
            raise ValueError(f"weights do not match the preset's tensors (name, shape) at: {diff[:6]}")
    types = tensor_types(p, quant)
    gen = WeightGen(p, seed)
    pools = _Pools(gen) if p.pooled else None
    w = GGUFWriter(path, p.family)
    try:
        _metadata(w, p, quant, seed)
        sizes = []
        for name, shape in specs:
            qt = _T(types[name])
            bs, ts = GGML_QUANT_SIZES[qt]
            byte_shape = (*shape[:-1], shape[-1] // bs * ts)
            sizes.append(math.prod(byte_shape))
            w.add_tensor_info(name, byte_shape, np.dtype(np.uint8), sizes[-1], raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        total, done = sum(sizes), 0
        if progress is not None:
            progress(0, len(specs), 0, total)
        for i, (name, shape) in enumerate(specs):
            t = types[name]
            if weights is not None:
                data = quantize(weights[name], t)
            elif pools is not None and t != "F32":
                data = pools.rows(name, shape, t)
            else:
                data = quantize(gen.tensor(name, shape), t)
            w.write_tensor_data(data)
            done += sizes[i]
            if progress is not None:
                progress(i + 1, len(specs), done, total)
    finally:
        w.close()


def _check_routing(path: Path, p: Preset, say: Callable[[str], None]) -> list[LayerSpread]:
    """Route the check prompt through the written file; raise if any checked layer collapsed."""
    tokens = build_vocab(p.n_vocab).tokenizer.encode(PROMPT_TEXT).ids[: p.check_tokens]  # type: ignore[attr-defined]
    sel = route_file(path, tokens, p.check_layers)
    want = expected_spread(p.n_expert, p.n_expert_used, p.zipf_alpha, p.route_noise, len(tokens))
    got = [spread(s, p.n_expert) for s in sel]
    say(f"routing over a {len(tokens)}-token prompt, expected from the preset: {want}")
    bad = []
    for i, g in enumerate(got):
        # Against what the preset asks for, and an absolute floor: at least 2K experts in use.
        ok = (
            g.entropy >= want.entropy - 0.12
            and g.top1_share <= max(2.0 * want.top1_share, 0.5 / p.n_expert_used)
            and g.coverage * p.n_expert >= min(p.n_expert, 2 * p.n_expert_used)
        )
        say(f"  layer {i:2d}: {g}{'' if ok else '  <- collapsed'}")
        if not ok:
            bad.append(i)
    if bad:
        raise RoutingCollapsedError(
            f"routing collapsed in layer(s) {', '.join(map(str, bad))} of the {p.name} model: tokens of a real "
            f"prompt go to the same few experts (expected {want}); the file was not written. "
            "Change --seed or the preset's zipf_alpha / route_noise."
        )
    return got


def make_model(
    preset: str | Preset = "tiny",
    quant: str | None = None,
    seed: int = 0,
    out: str | Path | None = None,
    *,
    check: bool = True,
    say: Callable[[str], None] | None = None,
    progress: Progress | None = None,
    **overrides: object,
) -> Path:
    """Write a synthetic ``qwen3moe`` GGUF to ``out`` (default: the cache path) and return its path.

    ``overrides`` change preset fields (``n_layer=2``, ``tie_embeddings=True``...). The routing of a
    real prompt is checked layer by layer before the file appears under its final name. ``progress``
    follows the tensors as they are written (see ``Progress``).
    """
    p = preset if isinstance(preset, Preset) else get_preset(preset)
    if overrides:
        p = p.with_overrides(**overrides)
    p.validate()
    q = _check_quant(quant or p.default_quant)
    say = say or (lambda s: log.info(s))
    target = Path(out) if out is not None else model_cache_path(p.name, q, seed)
    t0 = time.perf_counter()
    with atomic_path(target) as tmp:
        _write(tmp, p, q, seed, progress=progress)
        t1 = time.perf_counter()
        say(f"wrote {p.name} ({p.param_counts()['total'] / 1e6:.1f} M parameters, {q}) in {t1 - t0:.1f} s")
        if check:
            say("checking the routing of a real prompt through the written file…")
            _check_routing(tmp, p, say)
            say(f"routing checked in {time.perf_counter() - t1:.1f} s")
    return target


def write_weights(
    path: str | Path, preset: Preset, weights: dict[str, np.ndarray], quant: str = "f32", seed: int = 0
) -> Path:
    """Write given float weights (GGUF names, NumPy shapes as in ``tensor_specs``) as a model file.

    The metadata, tokenizer and chat template are the same as ``make_model``'s; no routing check.
    """
    preset.validate()
    target = Path(path)
    with atomic_path(target) as tmp:
        _write(tmp, preset, _check_quant(quant), seed, weights)
    return target


def model_cache_path(preset: str, quant: str, seed: int, **overrides: object) -> Path:
    """Where ``ensure_model`` keeps the model for these arguments (overrides of preset fields, if
    any, become part of the name)."""
    extra = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    return cache_dir("models") / f"{preset}-{quant}-seed{seed}{extra}-v{MAKER_VERSION}.gguf"


def ensure_model(preset: str = "tiny", quant: str | None = None, seed: int = 0) -> Path:
    """The cached model for (preset, quant, seed), made first if it is not there yet.

    Safe to call from several processes at once: one makes the file while the others wait, and a
    file only ever appears complete (it is written under a temporary name and renamed).
    """
    p = get_preset(preset)
    q = _check_quant(quant or p.default_quant)
    path = model_cache_path(preset, q, seed)
    if path.exists():
        return path
    with file_lock(path.with_suffix(".lock")):
        if not path.exists():
            make_model(p, q, seed, path)
    return path
