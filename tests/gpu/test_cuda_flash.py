"""Prompt-chunk attention on the tensor cores (native/src/cuda/flash_attn.cu), f16 and int8 KV caches:
close to a float64 reference, and a query's bits depend on its position and the cache only (alone, in a
chunk, in a sub-chunk, with positions off the tile grid, grouped query heads), and the engine's prompt
logits stay the same bits whatever the chunking."""

from __future__ import annotations

import numpy as np
import pytest

from tests.gpu._cuda_util import attention, cuda_lib

pytestmark = pytest.mark.gpu

STATUS_UNSUPPORTED = 4


def _flash(lib, q, k, v, T, H, Hkv, hd, on_device=0, kv_type=0):
    return attention(lib, "strata_cuda_flash_attention", kv_type, q, k, v, T, H, Hkv, hd, on_device)


def _decode_kernel(lib, q, k, v, T, H, Hkv, hd, kv_type=0):
    st, out = attention(lib, "strata_cuda_attention", kv_type, q, k, v, T, H, Hkv, hd)
    assert st == 0
    return out


def _int8_values(x: np.ndarray) -> np.ndarray:
    """The int8 cache's values in f32: q = rint(x / d), d = max|x| / 127 per block of 32, value q * d."""
    b = x.reshape(x.shape[0], -1, 32).astype(np.float32)
    d = np.abs(b).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    # + 0: rint gives -0.0 below 0.5 in magnitude, the kernel's int 0 times the scale +0.0
    return (np.rint(b * inv) * d + np.float32(0)).reshape(x.shape).astype(np.float32)


def _tile_values(x: np.ndarray, kv_type: int, f16: bool = True) -> np.ndarray:
    """What the kernel's products read, in float64: the f16 cache, or the int8 cache's values rounded to
    f16 once (f16=False: the int8 values unrounded, what the decode kernel reads)."""
    if kv_type == 0:
        return x.astype(np.float16).astype(np.float64)
    x8 = _int8_values(x)
    return (x8.astype(np.float16) if f16 else x8).astype(np.float64)


def _reference(q, k, v, T, H, Hkv, hd, kv_type=0, f16=True):
    """float64 causal attention over the cache's values as the kernel reads them (_tile_values), queries
    at positions n_pos - T .."""
    n_pos = k.shape[0]
    ks = _tile_values(k, kv_type, f16)
    vs = _tile_values(v, kv_type, f16)
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


@pytest.mark.parametrize("kv_type", [0, 1], ids=["f16", "int8"])
@pytest.mark.parametrize(
    "hd,H,Hkv,n_pos,T",
    [
        # int8 rows: kv_dim * 9 / 8 bytes, a multiple of 16 (16-byte copies) for kv_dim 128 .. 512, of 4
        # only for kv_dim 32 and 64 (4-byte copies)
        (128, 32, 4, 301, 301),  # the 30B preset's heads; several KV tiles, the last one partial
        (128, 8, 2, 100, 9),  # a chunk that starts and ends off the tile grid
        (64, 8, 4, 130, 67),
        (64, 6, 2, 200, 37),  # 3 query heads per kv head: a block's rows do not end on a token
        (32, 4, 2, 70, 70),
        (32, 12, 1, 65, 1),  # one token at the first position of the second tile
        (32, 2, 1, 1, 1),
    ],
)
def test_flash_attention_matches_reference_and_ignores_the_chunk(kv_type, hd, H, Hkv, n_pos, T):
    lib = cuda_lib()
    rng = np.random.default_rng(hd * 7 + n_pos + T)
    q = (rng.standard_normal((T, H * hd)) * 2).astype(np.float32)
    k = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    v = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    st, out = _flash(lib, q, k, v, T, H, Hkv, hd, kv_type=kv_type)
    assert st == 0, f"strata_cuda_flash_attention failed with status {st}"
    ref = _reference(q, k, v, T, H, Hkv, hd, kv_type)
    err = np.abs(out - ref).max() / np.abs(ref).max()
    # q and p go in as f16 hi + lo pairs (about 22 bits); the products accumulate in f32
    assert err < 1e-4, f"relative error {err:.2e} against the float64 reference"
    dec = _decode_kernel(lib, q, k, v, T, H, Hkv, hd, kv_type)
    # int8: the decode kernel reads the int8 values unrounded, this kernel rounded to f16 once; the two
    # float64 references differ by that rounding alone
    gap = 0.0
    if kv_type == 1:
        ref32 = _reference(q, k, v, T, H, Hkv, hd, kv_type, f16=False)
        gap = np.abs(ref - ref32).max() / np.abs(ref32).max()
    far = np.abs(out - dec).max() / np.abs(dec).max()
    assert far < 1e-4 + 2 * gap, f"{far:.2e} from the decode kernel (the references' gap {gap:.2e})"
    # a query's bits depend on its position and the cache only: alone (the cache ends at its position,
    # all bits set after it: f16 NaNs, int8 -1 with NaN scales), and inside a sub-chunk that starts and
    # ends elsewhere
    for t in sorted({0, 1 % T, T // 2, T - 1}):
        p = n_pos - T + t
        st, one = _flash(
            lib, np.ascontiguousarray(q[t : t + 1]), k[: p + 1], v[: p + 1], 1, H, Hkv, hd, kv_type=kv_type
        )
        assert st == 0
        assert _same_bits(one, out[t : t + 1]), f"query {t} (position {p}) alone differs"
    if T >= 3:
        t0, t1 = 1, T - 1  # queries t0 .. t1 - 1 as a chunk of their own
        p1 = n_pos - T + t1
        st, sub = _flash(
            lib, np.ascontiguousarray(q[t0:t1]), k[:p1], v[:p1], t1 - t0, H, Hkv, hd, kv_type=kv_type
        )
        assert st == 0
        assert _same_bits(sub, out[t0:t1]), "a sub-chunk's queries differ from the same queries in the chunk"
    st, dev = _flash(lib, q, k, v, T, H, Hkv, hd, on_device=1, kv_type=kv_type)
    assert st == 0 and _same_bits(dev, out), "position through device memory differs"


def test_flash_attention_int8_is_the_f16_cache_of_its_values():
    """An int8 cache gives the bits of an f16 cache that holds the int8 values rounded to f16 (what
    flash_attn.cu says it computes): the int8 values of k and v, rounded to f16 on the host, stored as an
    f16 cache, give the same output bit for bit (the f16 store of an f16-exact value is that value)."""
    lib = cuda_lib()
    hd, H, Hkv, n_pos, T = 128, 8, 2, 150, 70
    rng = np.random.default_rng(11)
    q = rng.standard_normal((T, H * hd)).astype(np.float32)
    k = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    v = rng.standard_normal((n_pos, Hkv * hd)).astype(np.float32)
    st, out8 = _flash(lib, q, k, v, T, H, Hkv, hd, kv_type=1)
    assert st == 0
    k16 = _int8_values(k).astype(np.float16).astype(np.float32)
    v16 = _int8_values(v).astype(np.float16).astype(np.float32)
    st, out16 = _flash(lib, q, k16, v16, T, H, Hkv, hd, kv_type=0)
    assert st == 0
    assert _same_bits(out8, out16), (
        f"int8 cache differs from the f16 cache of its values (max |diff| {np.abs(out8 - out16).max():.3e})"
    )


@pytest.mark.parametrize("kv_type,hd", [(1, 256), (1, 48), (0, 256), (0, 48)])
def test_flash_attention_refuses_what_it_does_not_cover(kv_type, hd):
    lib = cuda_lib()
    q = np.zeros((2, 2 * hd), np.float32)
    k = np.zeros((4, hd), np.float32)
    st, _ = _flash(lib, q, k, k.copy(), 2, 2, 1, hd, kv_type=kv_type)
    assert st == STATUS_UNSUPPORTED


def _prompt_logits(path, prompt, prefill: str, kv: str = "f16") -> np.ndarray:
    from strata import Engine, EngineConfig

    with Engine(path, EngineConfig(device="cuda", prefill=prefill, kv=kv)) as eng:
        eng.prefill(prompt)
        return eng.logits()


@pytest.mark.parametrize("kv", ["f16", "int8"])
@pytest.mark.parametrize("preset,quant", [("tiny", "f16"), ("small", "q8_0")])
def test_engine_prompt_attention_on_tensor_cores(preset, quant, kv, monkeypatch):
    """Head dims 32 (tiny) and 64 (small), f16 and int8 KV: the prompt logits are the same bits in chunks
    of any size, and close to the decode kernel's (STRATA_CUDA_FLASH=0)."""
    from strata import Engine, EngineConfig
    from strata.model import ensure_model

    cuda_lib()  # skips without a CUDA device
    path = ensure_model(preset, quant=quant, seed=0)
    with Engine(path, EngineConfig(device="cpu")) as eng:
        vocab = eng.info.n_vocab
    prompt = [int(t) for t in np.random.default_rng(5).integers(10, vocab - 10, size=301)]
    monkeypatch.setenv("STRATA_CUDA_FLASH", "1")
    ref = _prompt_logits(path, prompt, "auto", kv)
    for prefill in ["16", "100"]:  # 100: the last chunk is one token
        got = _prompt_logits(path, prompt, prefill, kv)
        assert _same_bits(got, ref), f"{kv} KV: prompt logits differ with --prefill {prefill}"
    monkeypatch.setenv("STRATA_CUDA_FLASH", "0")
    old = _prompt_logits(path, prompt, "auto", kv)
    assert not _same_bits(old, ref), "STRATA_CUDA_FLASH=0 gave the same bits: the switch changed nothing"
    nmse = float(np.mean((ref - old) ** 2) / np.mean(old**2))
    # f16 weights: only the attention's float expression differs (int8 KV: also the f16 rounding of the
    # cache's values, about 2^-12 relative); Q8_0: a last-bit difference can also move an activation across
    # an 8-bit rounding boundary (the CPU comparison's bounds)
    bound = (1e-6 if kv == "f16" else 1e-5) if quant == "f16" else 1e-3
    assert nmse < bound, f"{preset}/{quant}, {kv} KV: prompt logits nMSE {nmse:.3e} against the decode kernel"
