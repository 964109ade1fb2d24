"""Prompt-chunk attention on the tensor cores (native/src/cuda/flash_attn.cu): close to a float64
reference, and a query's bits depend on its position and the cache only (alone, in a chunk, in a
sub-chunk, with positions off the tile grid, grouped query heads), and the engine's prompt logits stay
the same bits whatever the chunking."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu._cuda_util import attention, cuda_lib

pytestmark = pytest.mark.gpu

STATUS_UNSUPPORTED = 4


def _flash(lib, q, k, v, T, H, Hkv, hd, on_device=0, kv_type=0):
    return attention(lib, "strata_cuda_flash_attention", kv_type, q, k, v, T, H, Hkv, hd, on_device)


def _decode_kernel(lib, q, k, v, T, H, Hkv, hd):
    st, out = attention(lib, "strata_cuda_attention", 0, q, k, v, T, H, Hkv, hd)
    assert st == 0
    return out


def _reference(q, k, v, T, H, Hkv, hd):
    """float64 causal attention over the f16-rounded cache, queries at positions n_pos - T .."""
    n_pos = k.shape[0]
    ks = k.astype(np.float16).astype(np.float64)
    vs = v.astype(np.float16).astype(np.float64)
    pos = np.arange(n_pos - T, n_pos)
    mask = np.arange(n_pos)[None, :] > pos[:, None]  # [T, n_pos]
    ref = np.zeros((T, H * hd))
    for h in range(H):
        kh = h // (H // Hkv)
        s = q[:, h * hd : (h + 1) * hd].astype(np.float64) @ ks[:, kh * hd : (kh + 1) * hd].T / np.sqrt(hd)
        s[mask] = -np.inf
        w = np.exp(s - s.max(axis=1, keepdims=True))
        ref[:, h * hd : (h + 1) * hd] = (w / w.sum(axis=1, keepdims=True)) @ vs[:, kh * hd : (kh + 1) * hd]
    return ref


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool((a.view(np.uint32) == b.view(np.uint32)).all())


@pytest.mark.parametrize(
    "hd,H,Hkv,n_pos,T",
    [
        (128, 32, 4, 301, 301),  # the 30B preset's heads; several KV tiles, the last one partial
        (128, 8, 2, 100, 9),  # a chunk that starts and ends off the tile grid
        (64, 8, 4, 130, 67),
        (64, 6, 2, 200, 37),  # 3 query heads per kv head: a block's rows do not end on a token
        (32, 4, 2, 70, 70),
        (32, 12, 1, 65, 1),  # one token at the first position of the second tile
        (32, 2, 1, 1, 1),
    ],
)
def test_flash_attention_matches_reference_and_ignores_the_chunk(hd, H, Hkv, n_pos, T):
    lib = cuda_lib()
    rng = np.random.default_rng(hd * 7 + n_pos + T)
    q = (rng.standard_normal((T, H * hd)) * 2).astype(np.float32)
    k = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    v = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    st, out = _flash(lib, q, k, v, T, H, Hkv, hd)
    assert st == 0, f"strata_cuda_flash_attention failed with status {st}"
    ref = _reference(q, k, v, T, H, Hkv, hd)
    err = np.abs(out - ref).max() / np.abs(ref).max()
    # q and p go in as f16 hi + lo pairs (about 22 bits); the products accumulate in f32
    assert err < 1e-4, f"relative error {err:.2e} against the float64 reference"
    dec = _decode_kernel(lib, q, k, v, T, H, Hkv, hd)
    assert np.abs(out - dec).max() / np.abs(dec).max() < 1e-4, "far from the decode kernel"
    # a query's bits depend on its position and the cache only: alone (the cache ends at its position,
    # NaNs after it), and inside a sub-chunk that starts and ends elsewhere
    for t in sorted({0, 1 % T, T // 2, T - 1}):
        p = n_pos - T + t
        st, one = _flash(lib, np.ascontiguousarray(q[t : t + 1]), k[: p + 1], v[: p + 1], 1, H, Hkv, hd)
        assert st == 0
        assert _same_bits(one, out[t : t + 1]), f"query {t} (position {p}) alone differs"
    if T >= 3:
        t0, t1 = 1, T - 1  # queries t0 .. t1 - 1 as a chunk of their own
        p1 = n_pos - T + t1
        st, sub = _flash(lib, np.ascontiguousarray(q[t0:t1]), k[:p1], v[:p1], t1 - t0, H, Hkv, hd)
        assert st == 0
        assert _same_bits(sub, out[t0:t1]), "a sub-chunk's queries differ from the same queries in the chunk"
    st, dev = _flash(lib, q, k, v, T, H, Hkv, hd, on_device=1)
    assert st == 0 and _same_bits(dev, out), "position through device memory differs"


@pytest.mark.parametrize("kv_type,hd", [(1, 128), (0, 256), (0, 48)])
def test_flash_attention_refuses_what_it_does_not_cover(kv_type, hd):
    lib = cuda_lib()
    q = np.zeros((2, 2 * hd), np.float32)
    k = np.zeros((4, hd), np.float32)
    st, _ = _flash(lib, q, k, k.copy(), 2, 2, 1, hd, kv_type=kv_type)
    assert st == STATUS_UNSUPPORTED


def _prompt_logits(path, prompt, prefill: str) -> np.ndarray:
    from strata import Engine, EngineConfig

    with Engine(path, EngineConfig(device="cuda", prefill=prefill)) as eng:
        eng.prefill(prompt)
        return eng.logits()


@pytest.mark.parametrize("preset,quant", [("tiny", "f16"), ("small", "q8_0")])
def test_engine_prompt_attention_on_tensor_cores(preset, quant, monkeypatch):
    """Head dims 32 (tiny) and 64 (small): the prompt logits are the same bits in chunks of any size, and
    close to the decode kernel's (STRATA_CUDA_FLASH=0)."""
    from strata import Engine, EngineConfig
    from strata.model import ensure_model

    cuda_lib()  # skips without a CUDA device
    path = ensure_model(preset, quant=quant, seed=0)
    with Engine(path, EngineConfig(device="cpu")) as eng:
        vocab = eng.info.n_vocab
    prompt = [int(t) for t in np.random.default_rng(5).integers(10, vocab - 10, size=301)]
    monkeypatch.setenv("STRATA_CUDA_FLASH", "1")
    ref = _prompt_logits(path, prompt, "auto")
    for prefill in ["16", "100"]:  # 100: the last chunk is one token
        got = _prompt_logits(path, prompt, prefill)
        assert _same_bits(got, ref), f"prompt logits differ with --prefill {prefill}"
    monkeypatch.setenv("STRATA_CUDA_FLASH", "0")
    old = _prompt_logits(path, prompt, "auto")
    assert not _same_bits(old, ref), "STRATA_CUDA_FLASH=0 gave the same bits: the switch changed nothing"
    nmse = float(np.mean((ref - old) ** 2) / np.mean(old**2))
    # f16 weights: only the attention's float expression differs; Q8_0: a last-bit difference can also move
    # an activation across an 8-bit rounding boundary (the CPU comparison's bounds)
    bound = 1e-6 if quant == "f16" else 1e-3
    assert nmse < bound, f"{preset}/{quant}: prompt logits nMSE {nmse:.3e} against the decode kernel"
