"""Architectures as data: what the engine says about a family it runs, one it lacks blocks for, and the
maker's presets of each family.

Files of families strata does not run are written with gguf-py's GGUFWriter holding only what the
engine reads before it refuses (their architecture, and for a dense llama its dimensions): the message
must name the missing block, never a missing key or tensor further on.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

import strata._engine as engine_mod
from strata import EngineConfig, UnsupportedModelError
from strata.model import ensure_model
from strata.model._presets import FAMILIES
from strata.model.cli import describe


def _stub(path: Path, arch: str, **ints: int) -> Path:
    w = GGUFWriter(path, arch)
    for k, v in ints.items():
        w.add_uint32(f"{arch}.{k}", v)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize(
    ("arch", "ints", "words"),
    [
        ("granitemoeshared", {}, "granitemoeshared: granite's shared experts are not supported yet"),
        ("qwen3next", {}, "qwen3next: the gated delta-net (linear attention) layers"),
        ("llama", {"embedding_length": 64, "block_count": 2}, "llama: this file has no experts"),
        ("mamba", {}, "architecture 'mamba' is not supported; strata runs qwen3moe, qwen2moe"),
    ],
)
def test_unsupported_family_names_the_missing_piece(
    tmp_path: Path, arch: str, ints: dict, words: str
) -> None:
    path = _stub(tmp_path / f"{arch}.gguf", arch, **ints)
    with pytest.raises(UnsupportedModelError) as exc:
        engine_mod.Engine(path, EngineConfig(vram_budget=64 << 20))
    assert words in str(exc.value)
    # strata model info says the same instead of blocks
    d = describe(path)
    assert d["blocks"] is None and words in d["unsupported"]


def test_deepseek2_with_the_older_kv_b_is_refused_by_name(tmp_path: Path) -> None:
    """A deepseek2 file of an older converter (keys' and values' decompression in one attn_kv_b) is refused
    naming that tensor and what to do, not read as something else."""
    path = tmp_path / "old-deepseek2.gguf"
    w = GGUFWriter(path, "deepseek2")
    for k, v in dict(
        embedding_length=64,
        block_count=1,
        expert_count=8,
        expert_used_count=2,
        expert_feed_forward_length=32,
        **{"attention.head_count": 4, "attention.key_length": 24, "attention.value_length": 16},
        **{"attention.kv_lora_rank": 32, "rope.dimension_count": 8},
    ).items():
        w.add_uint32(f"deepseek2.{k}", v)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.add_tensor("blk.0.attn_kv_b.weight", np.zeros((4 * (16 + 16), 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError) as exc:
        engine_mod.Engine(path, EngineConfig(vram_budget=64 << 20))
    msg = str(exc.value)
    assert (
        "blk.0.attn_kv_b.weight" in msg
        and "attn_k_b and attn_v_b" in msg
        and "convert the model again" in msg
    )


@pytest.mark.asan
@pytest.mark.parametrize(
    "preset",
    [
        "tiny",
        "tiny-qwen2moe",
        "tiny-mixtral",
        "tiny-olmoe",
        "tiny-granitemoe",
        "tiny-glm4moe",
        "tiny-deepseek2",
    ],
)
def test_maker_preset_of_each_family(preset: str) -> None:
    """The maker's file is the family's architecture, the engine names the family and its blocks, and a
    greedy reply and its logits are bit-identical with the whole model cached at 1 thread and with 16 of
    its 128 experts cached, prompts read in chunks of 16 tokens, at 2 threads (the determinism every family
    keeps: the expert cache, the loan and the chunking change no result)."""
    path = ensure_model(preset, "q8_0", 0)
    d = describe(path)
    arch = d["architecture"]
    attention = "MLA 4 heads" if arch == "deepseek2" else "GQA 4/2"
    assert arch in FAMILIES and d["blocks"].startswith(f"{FAMILIES[arch]}: attention {attention}")
    want_blocks = {
        "qwen3moe": "q/k norm per head",
        "qwen2moe": "shared expert with sigmoid gate",
        "llama": "rope norm",
        "olmoe": "q/k norm over the projection",
        "granitemoe": "granite multipliers",
        "glm4moe": "rope neox 16/32 dims; moe sigmoid with expert bias top-4 of 32 normalized scaled, shared expert, "
        "1 dense leading layer(s)",
        "deepseek2": "(q lora 64, kv lora 64, k 64, v 32; cache: latent + k_pe), rope norm 32/64 dims; moe sigmoid "
        "with expert bias top-4 of 32 normalized scaled, shared expert, 1 dense leading layer(s)",
    }[arch]
    assert want_blocks in d["blocks"], d["blocks"]
    replies = []
    for cfg in (EngineConfig(threads=1), EngineConfig(threads=2, expert_cache="16", prefill="16")):
        with engine_mod.Engine(path, cfg) as eng:
            assert (
                eng.plan.n_slots == 16
                if cfg.expert_cache == "16"
                else eng.plan.n_slots >= eng.plan.n_experts_total
            )
            eng.prefill(list(range(10, 60)))
            seq = []
            for _ in range(8):
                t = int(np.argmax(eng.logits()))
                seq.append(t)
                eng.decode(t)
            replies.append((seq, eng.logits().copy()))
    assert replies[0][0] == replies[1][0]
    assert np.array_equal(replies[0][1], replies[1][1])


@pytest.mark.asan
def test_profile_of_a_model_with_dense_leading_layers_names_model_layers(tmp_path: Path) -> None:
    """glm4moe's first layer is dense: the cache holds experts of layers 1.. only, and a saved profile names
    model layers (1..), which the next open reads back into the same residency."""
    path = ensure_model("tiny-glm4moe", "q8_0", 0)
    prof = tmp_path / "glm.profile"
    with engine_mod.Engine(path, EngineConfig(threads=1, expert_cache="24")) as eng:
        eng.prefill(list(range(10, 60)))
        eng.save_profile(prof)
        res = eng.residency()
    layers = {int(ln.split()[0]) for ln in prof.read_text().splitlines() if not ln.startswith("#")}
    assert layers == {1, 2, 3}
    assert (res[0] == -1).all() and (res[1:] >= 0).sum() == 24
    with engine_mod.Engine(path, EngineConfig(threads=1, expert_cache="24", expert_profile=str(prof))) as eng:
        again = eng.residency()
    assert set(zip(*np.nonzero(again >= 0), strict=True)) <= {
        (int(a), int(b)) for a in range(1, 4) for b in range(32)
    }
    assert (again[0] == -1).all() and (again[1:] >= 0).sum() == 24
