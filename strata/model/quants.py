"""NumPy quantizers for every weight type strata runs, and the usual per-tensor type mixes.

``quantize(x, qtype)`` turns float32 rows into GGUF blocks. The legacy 32-value types (Q4_0 ... Q8_0)
and the float types go through gguf-py, which quantizes them exactly as llama.cpp does; the K-quants
and i-quants, which gguf-py can only dequantize, are quantized here: round-to-nearest with the
format's own scales (no search for better scales), so the files are valid and realistic, and
gguf-py's ``dequantize`` reads them back within a bounded error.

``MIXES`` maps a mix name (``q4_k_m`` ...) to a function ``(tensor_name, layer, n_layers) -> type
name`` that says which type a tensor gets in files of that mix, following what llama.cpp's quantizer
puts where. ``fallback_type`` gives the type a row length that is not a whole number of blocks falls
back to.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

__all__ = [
    "MIXES",
    "QUANTIZABLE",
    "block_size",
    "fallback_type",
    "more_bits",
    "quantize",
    "row_bytes",
    "type_name",
]

QK_K = 256

# ---- type names ------------------------------------------------------------------------------------


def type_name(qtype: str | int) -> str:
    """The GGML name of a type given by name (any case) or id."""
    from gguf import GGMLQuantizationType

    if isinstance(qtype, str):
        try:
            return GGMLQuantizationType[qtype.upper()].name
        except KeyError:
            raise ValueError(f"unknown quantization type {qtype!r}") from None
    try:
        return GGMLQuantizationType(int(qtype)).name
    except ValueError:
        raise ValueError(f"unknown quantization type id {qtype!r}") from None


def block_size(qtype: str | int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    return GGML_QUANT_SIZES[GGMLQuantizationType[type_name(qtype)]][0]


def row_bytes(qtype: str | int, cols: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    bs, ts = GGML_QUANT_SIZES[GGMLQuantizationType[type_name(qtype)]]
    if cols % bs:
        raise ValueError(f"a row of {cols} values is not a whole number of {type_name(qtype)} blocks of {bs}")
    return cols // bs * ts


# ---- small helpers ---------------------------------------------------------------------------------


def _f16(v: np.ndarray) -> np.ndarray:
    """Round scales to f16 (clamped to its range) and back: the scale the file will hold."""
    return np.clip(v, -65504.0, 65504.0).astype(np.float16)


def _inv(v: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(v != 0, np.float32(1) / np.where(v != 0, v, 1), np.float32(0)).astype(np.float32)


def _rint(v: np.ndarray) -> np.ndarray:
    return np.rint(v).astype(np.int32)


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    """The element of largest magnitude along the last axis, with its sign."""
    i = np.abs(x).argmax(axis=-1)[..., None]
    return np.take_along_axis(x, i, axis=-1)[..., 0]


def _nibbles(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return (lo.astype(np.uint8) & 0xF) | ((hi.astype(np.uint8) & 0xF) << 4)


def _u8(*parts: np.ndarray) -> np.ndarray:
    nb = parts[0].shape[0]
    return np.concatenate([np.ascontiguousarray(p).view(np.uint8).reshape(nb, -1) for p in parts], axis=1)


def _pack_k_scales(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """8 6-bit scales and 8 6-bit mins into the 12 bytes of a Q4_K / Q5_K block."""
    sc = sc.astype(np.uint8)
    m = m.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    return out


def _affine(x: np.ndarray, levels: int, scale_levels: int) -> tuple[np.ndarray, ...]:
    """Sub-blocks x [nb, S, L] as d * sc * q - dmin * m with q in 0..levels, sc and m in 0..scale_levels."""
    lo = np.minimum(x.min(axis=-1), 0)
    hi = np.maximum(x.max(axis=-1), 0)
    scale = (hi - lo) / levels
    mn = -lo
    d = _f16(scale.max(axis=-1) / scale_levels)
    dmin = _f16(mn.max(axis=-1) / scale_levels)
    df, dminf = d.astype(np.float32), dmin.astype(np.float32)
    sc = np.clip(_rint(scale * _inv(df)[:, None]), 0, scale_levels)
    m = np.clip(_rint(mn * _inv(dminf)[:, None]), 0, scale_levels)
    dl = df[:, None] * sc
    ml = dminf[:, None] * m
    q = np.clip(_rint((x + ml[..., None]) * _inv(dl)[..., None]), 0, levels)
    return d, dmin, sc, m, q


# ---- K-quants --------------------------------------------------------------------------------------


def _q2_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    d, dmin, sc, m, q = _affine(b.reshape(nb, 16, 16), 3, 15)
    q = q.reshape(nb, 2, 4, 32).astype(np.uint8)  # value 128 g + 32 k + c
    qs = q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)
    scales = (sc.astype(np.uint8) & 0xF) | (m.astype(np.uint8) << 4)
    return _u8(scales, qs.reshape(nb, 64), d, dmin)


def _q3_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    x = b.reshape(nb, 16, 16)
    s = _signed_absmax(x) / -4  # the largest magnitude lands on -4, the one level without a twin
    d = _f16(np.abs(s).max(axis=-1) / 31)
    df = d.astype(np.float32)
    sc = np.clip(_rint(s * _inv(df)[:, None]), -32, 31)
    q = np.clip(_rint(x * _inv(df[:, None] * sc)[..., None]), -4, 3).reshape(nb, 256)
    u = (q + 4).astype(np.uint8)
    lo = (u & 3).reshape(nb, 2, 4, 32)
    qs = lo[:, :, 0] | (lo[:, :, 1] << 2) | (lo[:, :, 2] << 4) | (lo[:, :, 3] << 6)
    hb = (u >> 2).reshape(nb, 8, 32)  # bit k of hmask[c] is value 32 k + c
    hmask = np.zeros((nb, 32), np.uint8)
    for k in range(8):
        hmask |= hb[:, k] << k
    us = (sc + 32).astype(np.uint8)
    scales = np.empty((nb, 12), np.uint8)
    scales[:, 0:8] = (us[:, 0:8] & 0xF) | ((us[:, 8:16] & 0xF) << 4)
    hi = (us >> 4).reshape(nb, 4, 4)  # [k, c]: value 4 k + c
    scales[:, 8:12] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    return _u8(hmask, qs.reshape(nb, 64), scales, d)


def _q4_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    d, dmin, sc, m, q = _affine(b.reshape(nb, 8, 32), 15, 63)
    q = q.reshape(nb, 4, 2, 32)  # value 64 g + 32 h + c
    qs = _nibbles(q[:, :, 0], q[:, :, 1]).reshape(nb, 128)
    return _u8(d, dmin, _pack_k_scales(sc, m), qs)


def _q5_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    d, dmin, sc, m, q = _affine(b.reshape(nb, 8, 32), 31, 63)
    q = q.reshape(nb, 256).astype(np.uint8)
    q4 = q.reshape(nb, 4, 2, 32)
    qs = _nibbles(q4[:, :, 0], q4[:, :, 1]).reshape(nb, 128)
    hb = (q >> 4).reshape(nb, 8, 32)
    qh = np.zeros((nb, 32), np.uint8)
    for k in range(8):
        qh |= hb[:, k] << k
    return _u8(d, dmin, _pack_k_scales(sc, m), qh, qs)


def _q6_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    x = b.reshape(nb, 16, 16)
    s = _signed_absmax(x) / -32
    d = _f16(np.abs(s).max(axis=-1) / 127)
    df = d.astype(np.float32)
    sc = np.clip(_rint(s * _inv(df)[:, None]), -128, 127)
    q = np.clip(_rint(x * _inv(df[:, None] * sc)[..., None]), -32, 31).reshape(nb, 256)
    u = (q + 32).astype(np.uint8)
    ul = u.reshape(nb, 2, 2, 64)  # value 128 g + 64 h + c
    ql = _nibbles(ul[:, :, 0], ul[:, :, 1]).reshape(nb, 128)
    uh = (u >> 4).reshape(nb, 2, 4, 32)  # value 128 g + 32 k + c
    qh = uh[:, :, 0] | (uh[:, :, 1] << 2) | (uh[:, :, 2] << 4) | (uh[:, :, 3] << 6)
    return _u8(ql, qh.reshape(nb, 64), sc.astype(np.int8), d)


def _q8_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    amax = np.abs(b).max(axis=-1)
    d = (amax / 127).astype(np.float32)
    qs = np.clip(_rint(b * _inv(d)[:, None]), -127, 127).astype(np.int8)
    bsums = qs.reshape(nb, 16, 16).astype(np.int16).sum(axis=-1, dtype=np.int16)
    return _u8(d, qs, bsums)


# ---- i-quants --------------------------------------------------------------------------------------


def _iq4_values() -> np.ndarray:
    from gguf import quants as gq

    return np.array(gq.IQ4_NL.kvalues, dtype=np.float32)


def _nearest_value(t: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Index of the nearest entry of the sorted 1-D `values` for every element of t."""
    mid = (values[1:] + values[:-1]) / 2
    return np.searchsorted(mid, t).astype(np.uint8)


def _iq4_nl(b: np.ndarray) -> np.ndarray:
    kv = _iq4_values()
    d = _f16(_signed_absmax(b) / kv[0])
    q = _nearest_value(b * _inv(d.astype(np.float32))[:, None], kv)
    return _u8(d, _nibbles(q[:, :16], q[:, 16:]))


def _iq4_xs(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    kv = _iq4_values()
    x = b.reshape(nb, 8, 32)
    s = _signed_absmax(x) / kv[0]
    d = _f16(np.abs(s).max(axis=-1) / 31)
    df = d.astype(np.float32)
    ls = np.clip(_rint(s * _inv(df)[:, None]), -32, 31)
    q = _nearest_value(x * _inv(df[:, None] * ls)[..., None], kv)  # [nb, 8, 32]
    u = (ls + 32).astype(np.uint16)
    scales_h = np.zeros(nb, np.uint16)
    for j in range(8):
        scales_h |= (u[:, j] >> 4) << (2 * j)
    scales_l = _nibbles(u[:, 0::2].astype(np.uint8), u[:, 1::2].astype(np.uint8))
    qs = _nibbles(q[:, :, :16], q[:, :, 16:]).reshape(nb, 128)
    return _u8(d, scales_h, scales_l, qs)


@functools.cache
def _grid_table(cls_name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """gguf-py's grid of an i-quant [entries, dim], its per-coordinate levels, and for every tuple of
    levels (as a base-len(levels) code) the index of the nearest grid entry (squared distance)."""
    from gguf import quants as gq

    cls = getattr(gq, cls_name)
    cls.init_grid()
    grid = np.asarray(cls.grid, dtype=np.float32).reshape(cls.grid_shape)
    levels = np.unique(grid)
    dim = grid.shape[1]
    codes = np.indices((len(levels),) * dim).reshape(dim, -1).T  # [L^dim, dim], coordinate 0 first
    tuples = levels[codes]
    dist = (tuples * tuples).sum(1)[:, None] - 2 * tuples @ grid.T + (grid * grid).sum(1)[None, :]
    return grid, levels, dist.argmin(axis=1)


def _nearest_grid(t: np.ndarray, cls_name: str) -> np.ndarray:
    """Grid index for every row of t [N, dim] (values in grid units): each coordinate is rounded to
    the nearest level, and the tuple goes to the grid entry nearest to it."""
    grid, levels, table = _grid_table(cls_name)
    idx = _nearest_value(t, levels).astype(np.int64)  # [N, dim]
    weights = len(levels) ** np.arange(grid.shape[1] - 1, -1, -1)
    return table[idx @ weights]


def _even_signs(x: np.ndarray) -> np.ndarray:
    """Sign bits of groups of 8 [.., 8] with an even count of minus signs (the format stores 7 of the
    8 bits): where the count is odd, the sign of the element of least magnitude is flipped."""
    neg = x < 0
    odd = (neg.sum(axis=-1) & 1).astype(bool)
    small = np.abs(x).argmin(axis=-1)
    flip = np.zeros_like(neg)
    np.put_along_axis(flip, small[..., None], odd[..., None], axis=-1)
    return neg ^ flip


def _bits(b: np.ndarray) -> np.ndarray:
    """Boolean [..., 8] -> uint8 with bit j = element j."""
    return (b.astype(np.uint8) << np.arange(8, dtype=np.uint8)).sum(axis=-1, dtype=np.uint8)


def _odd_scales(t: np.ndarray, gmax: float, denom: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sub-block scales of the form d * (2 s + 1) / denom, s in 0..15, for wanted scales t [nb, S]
    (t = max |x| / gmax). Returns d (f16), s, and the effective scales as float32."""
    d = _f16(t.max(axis=-1) * denom / 31)
    df = d.astype(np.float32)
    s = np.clip(_rint((t * denom * _inv(df)[:, None] - 1) / 2), 0, 15)
    eff = df[:, None] * (2 * s + 1).astype(np.float32) / np.float32(denom)
    return d, s, eff


def _signs_scale_words(neg: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The u32 of each 32 values of IQ3_XXS and IQ2_XXS ([nb, 8], "<u4"): the 7-bit sign patterns of
    its 4 groups of 8 values (``neg`` [nb, 8, 4, 8], the 8th sign implied) at bits 7 l, and its scale
    ``s`` in bits 28..31."""
    sidx = (_bits(neg) & 127).astype(np.uint32)  # [nb, 8, 4]
    words = s.astype(np.uint32) << 28
    for lidx in range(4):
        words |= sidx[:, :, lidx] << (7 * lidx)
    return words.astype("<u4")


def _iq3_xxs(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    grid = _grid_table("IQ3_XXS")[0]  # [256, 4]
    x = b.reshape(nb, 8, 32)
    d, s, eff = _odd_scales(np.abs(x).max(axis=-1) / grid.max(), float(grid.max()), 4.0)
    neg = _even_signs(x.reshape(nb, 8, 4, 8))
    mag = np.abs(x) * _inv(eff)[..., None]  # in grid units
    idx = _nearest_grid(mag.reshape(-1, 4), "IQ3_XXS").reshape(nb, 64).astype(np.uint8)
    return _u8(d, idx, _signs_scale_words(neg, s))


def _iq3_s(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    grid = _grid_table("IQ3_S")[0]  # [512, 4]
    x = b.reshape(nb, 8, 32)
    d, s, eff = _odd_scales(np.abs(x).max(axis=-1) / grid.max(), float(grid.max()), 1.0)
    mag = np.abs(x) * _inv(eff)[..., None]
    idx = _nearest_grid(mag.reshape(-1, 4), "IQ3_S").reshape(nb, 64)
    qs = (idx & 0xFF).astype(np.uint8)
    qh = _bits((idx >> 8).astype(bool).reshape(nb, 8, 8))
    signs = _bits((x < 0).reshape(nb, 32, 8))
    sc = s.astype(np.uint8)
    scales = _nibbles(sc[:, 0::2], sc[:, 1::2])
    return _u8(d, qs, qh, signs, scales)


def _iq2_xs(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    grid = _grid_table("IQ2_XS")[0]  # [512, 8]
    x = b.reshape(nb, 16, 16)
    d, s, eff = _odd_scales(np.abs(x).max(axis=-1) / grid.max(), float(grid.max()), 8.0)
    neg = _even_signs(x.reshape(nb, 32, 8))
    mag = np.abs(x) * _inv(eff)[..., None]
    idx = _nearest_grid(mag.reshape(-1, 8), "IQ2_XS").reshape(nb, 32).astype(np.uint16)
    qs = idx | ((_bits(neg) & 127).astype(np.uint16) << 9)
    sc = s.astype(np.uint8)
    scales = _nibbles(sc[:, 0::2], sc[:, 1::2])
    return _u8(d, qs.astype("<u2"), scales)


def _iq2_xxs(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    grid = _grid_table("IQ2_XXS")[0]  # [256, 8]
    x = b.reshape(nb, 8, 32)
    d, s, eff = _odd_scales(np.abs(x).max(axis=-1) / grid.max(), float(grid.max()), 8.0)
    neg = _even_signs(x.reshape(nb, 8, 4, 8))
    mag = np.abs(x) * _inv(eff)[..., None]
    idx = _nearest_grid(mag.reshape(-1, 8), "IQ2_XXS").reshape(nb, 8, 4).astype(np.uint8)
    # per 32 values: the 4 index bytes, then the u32 of signs and scale
    qs = np.concatenate([idx, _signs_scale_words(neg, s)[..., None].view(np.uint8)], axis=-1).reshape(nb, 64)
    return _u8(d, qs)


def _iq2_s(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    grid = _grid_table("IQ2_S")[0]  # [1024, 8]
    x = b.reshape(nb, 16, 16)
    d, s, eff = _odd_scales(np.abs(x).max(axis=-1) / grid.max(), float(grid.max()), 8.0)
    mag = np.abs(x) * _inv(eff)[..., None]
    idx = _nearest_grid(mag.reshape(-1, 8), "IQ2_S").reshape(nb, 32)
    qs = (idx & 0xFF).astype(np.uint8)
    hi = (idx >> 8).astype(np.uint8).reshape(nb, 8, 4)  # index 4 k + m: bits 2 m of qh[k]
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    signs = _bits((x < 0).reshape(nb, 32, 8))
    sc = s.astype(np.uint8)
    return _u8(d, qs, signs, qh, _nibbles(sc[:, 0::2], sc[:, 1::2]))


_IQ1_DELTA = np.float32(0.125)


def _iq1_fit(x: np.ndarray, dl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ1 groups x [N, G, 8] at scales dl [N]: for each group (sharing one delta sign) the grid
    indices [N, G] and whether the delta is negative [N], the better of the two signs."""
    grid = _grid_table("IQ1_S")[0]
    inv = _inv(dl)[:, None, None]
    fits = []
    for delta in (_IQ1_DELTA, -_IQ1_DELTA):
        idx = _nearest_grid((x * inv - delta).reshape(-1, 8), "IQ1_S").reshape(x.shape[:-1])
        err = ((dl[:, None, None] * (grid[idx] + delta) - x) ** 2).sum(axis=(-2, -1))
        fits.append((idx, err))
    (pos_idx, pos_err), (neg_idx, neg_err) = fits
    neg = neg_err < pos_err
    return np.where(neg[:, None], neg_idx, pos_idx), neg


def _iq1_scales(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IQ1 scales d (2 s + 1), s in 0..7, for sub-blocks x [nb, S, L]: the wanted scale of a
    sub-block is its RMS (the ternary levels sit near one standard deviation)."""
    want = np.sqrt((x.astype(np.float64) ** 2).mean(axis=-1)).astype(np.float32)
    d = _f16(want.max(axis=-1) / 15)
    df = d.astype(np.float32)
    s = np.clip(_rint((want * _inv(df)[:, None] - 1) / 2), 0, 7)
    return d, s, df[:, None] * (2 * s + 1).astype(np.float32)


def _iq1_s(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    x = b.reshape(nb, 8, 32)
    d, s, dl = _iq1_scales(x)
    idx, neg = _iq1_fit(x.reshape(nb * 8, 4, 8), dl.reshape(-1))
    idx = idx.reshape(nb, 8, 4)
    qs = (idx & 0xFF).astype(np.uint8).reshape(nb, 32)
    qh = s.astype(np.uint16) << 12 | neg.reshape(nb, 8).astype(np.uint16) << 15
    for lidx in range(4):
        qh |= ((idx[:, :, lidx] >> 8) & 7).astype(np.uint16) << (3 * lidx)
    return _u8(d, qs, qh.astype("<u2"))


def _iq1_m(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    x = b.reshape(nb, 16, 16)
    d, s, dl = _iq1_scales(x)
    # one delta per 8 values: groups of one index each
    idx, neg = _iq1_fit(x.reshape(nb * 32, 1, 8), np.repeat(dl.reshape(-1), 2))
    idx = idx.reshape(nb, 32)
    nib = (((idx >> 8) & 7) | (neg.reshape(nb, 32).astype(np.int64) << 3)).astype(np.uint8)
    qh = nib[:, 0::2] | (nib[:, 1::2] << 4)
    dbits = d.view(np.uint16)
    sc = np.zeros((nb, 4), np.uint16)
    s16 = s.astype(np.uint16).reshape(nb, 4, 4)
    for k in range(4):
        sc |= s16[:, :, k] << (3 * k)
    for w in range(4):
        sc[:, w] |= ((dbits >> (4 * w)) & 0xF) << 12
    return _u8((idx & 0xFF).astype(np.uint8), qh, sc.astype("<u2"))


# ---- the entry point -------------------------------------------------------------------------------

_OWN: dict[str, tuple[int, Callable[[np.ndarray], np.ndarray]]] = {
    "Q2_K": (QK_K, _q2_k),
    "Q3_K": (QK_K, _q3_k),
    "Q4_K": (QK_K, _q4_k),
    "Q5_K": (QK_K, _q5_k),
    "Q6_K": (QK_K, _q6_k),
    "Q8_K": (QK_K, _q8_k),
    "IQ4_NL": (32, _iq4_nl),
    "IQ4_XS": (QK_K, _iq4_xs),
    "IQ3_XXS": (QK_K, _iq3_xxs),
    "IQ3_S": (QK_K, _iq3_s),
    "IQ2_XS": (QK_K, _iq2_xs),
    "IQ2_XXS": (QK_K, _iq2_xxs),
    "IQ2_S": (QK_K, _iq2_s),
    "IQ1_S": (QK_K, _iq1_s),
    "IQ1_M": (QK_K, _iq1_m),
}
_GGUF_PY = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4")
QUANTIZABLE: tuple[str, ...] = (*_GGUF_PY, *_OWN)

# Blocks quantized per call of a block quantizer: bounds the temporaries of the grid searches.
_CHUNK_BLOCKS = 4096


def quantize(x: np.ndarray, qtype: str | int) -> np.ndarray:
    """Quantize float32 rows ``x [..., cols]`` to ``qtype`` (a name or a GGML type id).

    Returns uint8 ``[..., row_bytes]``: each row's blocks, as a GGUF tensor stores them.
    """
    name = type_name(qtype)
    a = np.ascontiguousarray(x, dtype=np.float32)
    if a.ndim == 0:
        raise ValueError("quantize needs rows: an array of at least one dimension")
    cols = a.shape[-1]
    rb = row_bytes(name, cols)
    if name not in ("F32", "F16", "BF16") and not np.isfinite(a).all():
        raise ValueError(f"quantize to {name}: the input has NaN or infinite values")
    if name in _GGUF_PY:
        from gguf import GGMLQuantizationType
        from gguf import quants as gq

        out = np.asarray(gq.quantize(a, GGMLQuantizationType[name]))
        return np.ascontiguousarray(out).view(np.uint8).reshape(*a.shape[:-1], rb)
    if name not in _OWN:
        raise NotImplementedError(
            f"strata cannot quantize to {name}; types it can quantize: {', '.join(QUANTIZABLE)}"
        )
    bs, fn = _OWN[name]
    blocks = a.reshape(-1, bs)
    parts = [fn(blocks[i : i + _CHUNK_BLOCKS]) for i in range(0, blocks.shape[0], _CHUNK_BLOCKS)]
    out = np.concatenate(parts, axis=0) if parts else np.zeros((0, rb // max(1, cols // bs)), np.uint8)
    return np.ascontiguousarray(out).reshape(*a.shape[:-1], rb)


# ---- mixes -----------------------------------------------------------------------------------------

# Row lengths that are not a whole number of blocks fall back to a 32-value type of similar size, as
# llama.cpp's quantizer does.
_FALLBACK = {
    "Q2_K": "IQ4_NL",
    "Q3_K": "IQ4_NL",
    "Q4_K": "Q5_0",
    "Q5_K": "Q5_1",
    "Q6_K": "Q8_0",
    "IQ4_XS": "IQ4_NL",
    "IQ3_XXS": "IQ4_NL",
    "IQ3_S": "IQ4_NL",
    "IQ2_XS": "IQ4_NL",
    "IQ2_XXS": "IQ4_NL",
    "IQ2_S": "IQ4_NL",
    "IQ1_S": "IQ4_NL",
    "IQ1_M": "IQ4_NL",
}


def fallback_type(qtype: str | int, cols: int) -> str:
    """The type a row of ``cols`` values gets when ``qtype``'s blocks do not divide it."""
    t = type_name(qtype)
    while cols % block_size(t):
        t = _FALLBACK.get(t, "Q8_0") if t != "Q8_0" else "F16"
    return t


def more_bits(layer: int, n_layers: int) -> bool:
    """The layers that the _M mixes give more bits: the first and last eighth, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def _role(name: str) -> str:
    """attn_q, ffn_down_exps, output, token_embd, norm, router ... from a GGUF tensor name."""
    if name.endswith("_norm.weight") or name.endswith("norm.weight"):
        return "norm"
    if ".ffn_gate_inp." in name:
        return "router"
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) >= 3:
        return parts[2]
    return parts[0]


Mix = Callable[..., str]

# The llama.cpp file types of the mixes (general.file_type) and each one's default tensor type.
FILE_TYPES: dict[str, tuple[int, str]] = {
    "q4_0": (2, "Q4_0"), "q4_1": (3, "Q4_1"), "q8_0": (7, "Q8_0"), "q5_0": (8, "Q5_0"), "q5_1": (9, "Q5_1"),
    "q2_k": (10, "Q2_K"), "q3_k_s": (11, "Q3_K"), "q3_k_m": (12, "Q3_K"), "q3_k_l": (13, "Q3_K"),
    "q4_k_s": (14, "Q4_K"), "q4_k_m": (15, "Q4_K"), "q5_k_s": (16, "Q5_K"), "q5_k_m": (17, "Q5_K"),
    "q6_k": (18, "Q6_K"), "iq2_xxs": (19, "IQ2_XXS"), "iq2_xs": (20, "IQ2_XS"), "iq3_xxs": (23, "IQ3_XXS"),
    "iq1_s": (24, "IQ1_S"), "iq4_nl": (25, "IQ4_NL"), "iq3_s": (26, "IQ3_S"), "iq2_s": (28, "IQ2_XS"),
    "iq2_m": (29, "IQ2_S"), "iq4_xs": (30, "IQ4_XS"), "iq1_m": (31, "IQ1_M"), "mxfp4_moe": (38, "MXFP4"),
}  # fmt: skip

# The 1- and 2-bit i-quant mixes share one set of rules.
_LOW_IQ = ("iq2_xxs", "iq2_xs", "iq1_s", "iq2_s", "iq2_m", "iq1_m")


def _mix(ftype: str) -> Mix:
    """The type llama.cpp's quantizer (without an importance matrix) gives each tensor in a file of
    mix ``ftype``. ``layer`` is the tensor's block (one attn_v and one ffn_down per block, as in
    qwen3moe, so llama.cpp's running counters of those tensors equal it); ``n_expert`` and ``n_gqa``
    (head_count / head_count_kv) are the model's; ``cols``, the row length, decides the output matrix of a
    model whose rows do not hold the mix's blocks. Norms and the router stay F32."""
    base = FILE_TYPES[ftype][1]

    def pick(
        tensor_name: str,
        layer: int,
        n_layers: int,
        *,
        n_expert: int | None = None,
        n_gqa: int | None = None,
        cols: int | None = None,
    ) -> str:
        role = _role(tensor_name)
        e = n_expert or 0
        gqa = n_gqa or 1
        eighth = layer < n_layers // 8
        more = more_bits(layer, n_layers)
        if role in ("norm", "router"):
            return "F32"
        if role == "output":
            # rows that do not hold the mix's own blocks: Q8_0 (not the fallback table's choice)
            if ftype == "mxfp4_moe" or (cols is not None and cols % block_size(base)):
                return "Q8_0"
            if ftype in (*_LOW_IQ, "iq3_xxs"):
                return "Q5_K"
            return base if base == "Q8_0" else "Q6_K"
        if ftype == "mxfp4_moe":  # the expert stacks MXFP4, every other matrix Q8_0
            return "MXFP4" if role.endswith("_exps") else "Q8_0"
        if role == "token_embd":
            if ftype in ("iq2_xxs", "iq2_xs", "iq1_s", "iq1_m"):
                return "Q2_K"
            if ftype in ("iq2_s", "iq2_m", "iq3_xxs"):
                return "IQ3_S"
            return base
        if ftype in _LOW_IQ:
            wide = "IQ3_S" if ftype in ("iq2_s", "iq2_m") else "Q2_K"
            if role == "attn_v":
                return "Q4_K" if gqa >= 4 or e >= 4 else wide
            if role == "attn_k" and e == 8:
                return "Q4_K"
            if role.startswith("ffn_down"):
                return wide if eighth else base
            if role == "attn_output":
                if e == 8:
                    return "Q5_K"
                if ftype in ("iq1_s", "iq1_m"):
                    return "IQ2_XXS"
                if ftype in ("iq2_s", "iq2_m"):
                    return "IQ3_S"
            return base
        if role == "attn_v":
            t = base
            if ftype == "q2_k":
                t = "Q4_K" if gqa >= 4 else "Q3_K"
            elif ftype == "iq3_xxs":
                t = "Q4_K" if gqa >= 4 else "IQ3_S"
            elif ftype == "iq3_s" and gqa >= 4:
                t = "Q4_K"
            elif ftype == "q3_k_m":
                t = "Q5_K" if layer < 2 else "Q4_K"
            elif ftype == "q3_k_l":
                t = "Q5_K"
            elif ftype in ("iq4_nl", "iq4_xs") and gqa >= 4:
                t = "Q5_K"
            elif ftype in ("q4_k_m", "q5_k_m") and more:
                t = "Q6_K"
            elif ftype == "q4_k_s" and layer < 4:
                t = "Q5_K"
            return "Q8_0" if e == 8 else t
        if role == "attn_k":
            if e == 8:
                return "Q8_0"
            return "IQ2_S" if ftype == "iq3_xxs" else base
        if role == "attn_q":
            return "IQ2_S" if ftype == "iq3_xxs" else base
        if role.startswith("ffn_down"):
            if ftype == "q2_k":
                return "Q3_K"
            if ftype == "iq3_xxs":
                return "Q4_K" if eighth else "Q3_K"
            if ftype == "q3_k_m":
                return "Q5_K" if layer < n_layers // 16 else "Q4_K"
            if ftype == "q3_k_l":
                return "Q5_K"
            if ftype in ("q4_k_m", "q5_k_m"):
                return "Q6_K" if more else base
            if ftype in ("iq4_nl", "iq4_xs", "q4_k_s") and eighth:
                return "Q5_K"
            return base
        if role == "attn_output":
            if e == 8:
                eight = (
                    "q2_k",
                    "iq3_xxs",
                    "q3_k_s",
                    "q3_k_m",
                    "iq4_nl",
                    "q4_k_s",
                    "q4_k_m",
                    "iq3_s",
                    "iq4_xs",
                )
                return "Q5_K" if ftype in eight else base
            return {"q2_k": "Q3_K", "iq3_xxs": "IQ3_S", "q3_k_m": "Q4_K", "q3_k_l": "Q5_K"}.get(ftype, base)
        return base

    return pick


MIXES: dict[str, Mix] = {name: _mix(name) for name in FILE_TYPES}
