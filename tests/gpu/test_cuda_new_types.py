"""Every weight type the CPU runs, on --device cuda: Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, IQ4_NL, IQ4_XS,
IQ3_XXS, IQ3_S, IQ2_XS, IQ2_XXS, IQ2_S, IQ1_S, IQ1_M and MXFP4 (the first seven types are in
test_cuda_kernels.py).

For each: the device's weights are gguf-py's bit for bit, the device product is its host mirror's bit for
bit (one token alone or inside a batch; the tensor-core prompt product is checked in test_cuda_mmq.py), and
a model of that type (made by strata.model.make_model in llama.cpp's mix) opens with --device cuda, gives
the same reply whichever way its decode misses are served (--miss host runs the mirror) and whatever the
prompt chunk, and is close to the CPU backend.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from strata import Engine, EngineConfig
from strata._exceptions import StrataError
from tests.gpu._cuda_util import NEW_TYPES, cuda_lib, random_rows
from tests.gpu.test_cuda_kernels import _mirror, _run

pytestmark = pytest.mark.gpu

# type -> the quant whose file (tiny preset, 256-wide rows) holds it in the expert matrices
QUANT_OF = {
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q5_1": "q5_1",
    "Q2_K": "q2_k",
    "Q3_K": "q3_k_m",
    "Q5_K": "q5_k_m",
    "IQ4_NL": "iq4_nl",
    "IQ4_XS": "iq4_xs",
    "IQ3_XXS": "iq3_xxs",
    "IQ3_S": "iq3_s",
    "IQ2_XS": "iq2_xs",
    "IQ2_XXS": "iq2_xxs",
    "IQ2_S": "iq2_m",
    "IQ1_S": "iq1_s",
    "IQ1_M": "iq1_m",
    "MXFP4": "mxfp4_moe",
}
assert set(QUANT_OF) == set(NEW_TYPES)


def _block(name: str) -> int:
    import gguf

    return gguf.GGML_QUANT_SIZES[getattr(gguf.GGMLQuantizationType, name)][0]


def _same_values(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """Equal as numbers (a -0 weight times 1 plus +0 sums is +0), NaN where the reference has NaN."""
    return (got == want) | (np.isnan(got) & np.isnan(want))


@pytest.mark.parametrize("name", list(NEW_TYPES))
def test_device_dequantizes_as_gguf_py(name):
    """With x = e_k each lane adds w * 0 and w[k] * 1, so y[r] is the device's value k of row r exactly: the
    whole matrix from one batch of cols one-hot tokens (the 8-token kernel), and a few from single tokens."""
    lib = cuda_lib()
    rows, cols = 40, 512
    rng = np.random.default_rng(31)
    w, dense = random_rows(name, rows, cols, rng)
    w = np.ascontiguousarray(w)
    eye = np.eye(cols, dtype=np.float32)
    y = _run(lib, NEW_TYPES[name], w, rows, cols, eye).T
    same = _same_values(y, dense)
    assert same.all(), (
        f"{name}: {np.count_nonzero(~same)} device values differ from gguf-py's; first at "
        f"{tuple(np.argwhere(~same)[0])}: {y[~same][0]!r} vs {dense[~same][0]!r}"
    )
    for k in (0, 37, 300, cols - 1):
        y1 = _run(lib, NEW_TYPES[name], w, rows, cols, np.ascontiguousarray(eye[k : k + 1]))[0]
        assert _same_values(y1, dense[:, k]).all(), f"{name}: column {k} alone"


@pytest.mark.parametrize("name", list(NEW_TYPES))
@pytest.mark.parametrize("rows,cols", [(64, 256), (300, 2048), (7, 768)])
def test_matvec_matches_mirror_and_reference(name, rows, cols):
    lib = cuda_lib()
    if cols % _block(name):
        pytest.skip(f"{name} rows are whole blocks of {_block(name)} values")
    rng = np.random.default_rng(rows * 7 + cols)
    w, dense = random_rows(name, rows, cols, rng)
    w = np.ascontiguousarray(w)
    x = rng.standard_normal((11, cols)).astype(np.float32)
    y = _run(lib, NEW_TYPES[name], w, rows, cols, x)
    assert np.isfinite(y).all(), "every output written and finite"
    for t in range(x.shape[0]):
        ym = _mirror(lib, NEW_TYPES[name], w, rows, cols, np.ascontiguousarray(x[t]))
        bad = np.nonzero(y[t].view(np.uint32) != ym.view(np.uint32))[0]
        assert bad.size == 0, f"{name}: token {t} row {bad[0]} device {y[t, bad[0]]!r} mirror {ym[bad[0]]!r}"
    # one token alone gives the same bits as inside a batch
    for t in (0, 3, 10):
        y1 = _run(lib, NEW_TYPES[name], w, rows, cols, np.ascontiguousarray(x[t : t + 1]))
        assert (y1[0].view(np.uint32) == y[t].view(np.uint32)).all(), f"{name}: token {t} alone"
    ref = x.astype(np.float64) @ dense.astype(np.float64).T
    err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{name}: relative error {err:.2e} against the float64 reference"


# ---- an engine run of a model of each type ----------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


@pytest.fixture(scope="module")
def model_of(tmp_path_factory):
    """The path of a tiny model (2 layers, 256-wide rows so that the 256-value blocks fit) of a quant."""
    from strata.model import make_model

    root = tmp_path_factory.mktemp("types")
    made: dict[str, Path] = {}

    def get(quant: str) -> Path:
        if quant not in made:
            made[quant] = make_model(
                "tiny", quant, 0, root / f"{quant}.gguf", d_model=256, d_ff_expert=256, n_layer=2
            )
        return made[quant]

    return get


def _generate(path: Path, cfg: EngineConfig, prompt: list[int], n_gen: int):
    with Engine(path, cfg) as eng:
        eng.prefill(prompt)
        first = eng.logits()
        eng.kv_reset()
        res = eng.generate(prompt, max_tokens=n_gen, top_logits=2, stop_at_eos=False)
        return res.tokens, first, [[v for _, v in step] for step in res.top], eng.stats()


@pytest.mark.parametrize("name", list(NEW_TYPES))
def test_engine_runs_the_type_on_cuda(name, model_of, monkeypatch):
    from gguf import GGUFReader

    path = model_of(QUANT_OF[name])
    types = {t.tensor_type.name for t in GGUFReader(str(path)).tensors}
    assert name in types, f"{QUANT_OF[name]} holds {sorted(types)}"
    with Engine(path, EngineConfig(device="cpu")) as eng:
        vocab = eng.info.n_vocab
        n_experts = eng.info.n_layer * eng.info.n_expert
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.integers(10, vocab - 10, size=70)]
    _, cpu_first, _, _ = _generate(path, EngineConfig(device="cpu"), prompt, 1)
    ref = _generate(path, EngineConfig(device="cuda"), prompt, 16)
    # every expert resident, then a cache too small for them: misses run on the host (the mirror), are
    # copied to the device, or are read from host memory; and prompt chunks of 7 (ending in 1 token)
    runs = []
    for cache in (str(n_experts * 3 // 4), str(n_experts - 8)):
        try:
            for miss, prefill in (("host", "auto"), ("copy", "7"), ("read", "auto"), ("host", "7")):
                cfg = EngineConfig(device="cuda", expert_cache=cache, miss=miss, prefill=prefill)
                tok, first, top, stats = _generate(path, cfg, prompt, 16)
                args = cfg.to_cli_args()
                assert tok == ref[0], f"{name}: tokens differ with {args}"
                assert first.tobytes() == ref[1].tobytes(), f"{name}: prompt logits differ with {args}"
                assert top == ref[2], f"{name}: decode logits differ with {args}"
                runs.append((miss, stats.misses, stats.host_expert_runs))
            break
        except StrataError as e:  # a cache too small for the prompt path's loan on this model
            if "borrow" not in str(e):
                raise
    assert any(m == "host" and h > 0 for m, _, h in runs), f"{name}: no decode miss ran on the host: {runs}"
    # The backends differ in their activations (the CPU's 8-bit blocks of 256 or 32 values, the device's
    # prompt products in blocks of 32 and float decode products), and this random-weight model amplifies
    # such differences (test_cuda_mmq.py measured 3.7e-2 on small/q4_k_m); a wrong product is about as
    # far as unrelated logits.
    nmse = float(np.mean((ref[1] - cpu_first) ** 2) / np.mean(cpu_first**2))
    assert nmse < 0.1, f"{name}: first logits' nMSE against the CPU's is {nmse:.2e}"
    # the portable path (plain copies, m8n8k16 products, no programmatic launches): the same bits
    monkeypatch.setenv("STRATA_CUDA_PORTABLE", "1")
    tok, first, top, _ = _generate(path, EngineConfig(device="cuda"), prompt, 16)
    assert (tok, first.tobytes(), top) == (ref[0], ref[1].tobytes(), ref[2]), (
        f"{name}: STRATA_CUDA_PORTABLE=1 differs"
    )
    monkeypatch.delenv("STRATA_CUDA_PORTABLE")
    # without the tensor cores (STRATA_CUDA_MMQ=0: the batched matrix-vector kernel in prompt chunks): the
    # same prompt logits whatever the chunk, close to the tensor cores' (8-bit activations there)
    monkeypatch.setenv("STRATA_CUDA_MMQ", "0")
    plain = [_generate(path, EngineConfig(device="cuda", prefill=p), prompt, 4) for p in ("auto", "7")]
    assert plain[0][1].tobytes() == plain[1][1].tobytes(), (
        f"{name}: STRATA_CUDA_MMQ=0 prompt logits differ by chunk"
    )
    assert plain[0][0] == plain[1][0], f"{name}: STRATA_CUDA_MMQ=0 replies differ by chunk"
    nmse = float(np.mean((plain[0][1] - ref[1]) ** 2) / np.mean(ref[1] ** 2))
    assert nmse < 0.1, f"{name}: STRATA_CUDA_MMQ=0 logits' nMSE against the tensor cores' is {nmse:.2e}"


def test_unknown_type_is_refused_by_the_kernels():
    """A type the device does not run (Q8_1, the CPU's activation type) is refused, not run as garbage."""
    lib = cuda_lib()
    w = np.zeros((4, 36 * 8), dtype=np.uint8)
    x = np.zeros((1, 256), dtype=np.float32)
    y = np.zeros((1, 4), dtype=np.float32)
    st = lib.strata_cuda_matvec(
        9, w.ctypes.data_as(ctypes.c_void_p), 4, 256, x.ctypes.data_as(ctypes.c_void_p), 1,
        y.ctypes.data_as(ctypes.c_void_p),
    )  # fmt: skip
    assert st != 0
