"""strata._enums mirrors every enumeration of native/include/strata.h: the same constants, the same
numbers, and no enumeration of the header left without its Python class."""

from __future__ import annotations

import re
from enum import IntEnum
from pathlib import Path

import pytest

from strata import _enums
from strata._config import EngineConfig
from strata._engine import config_to_params

HEADER = Path(__file__).resolve().parents[1] / "native" / "include" / "strata.h"

# C enumeration -> (Python class, the prefix its constants carry that the members drop)
MIRRORS: dict[str, tuple[type[IntEnum], str]] = {
    "strata_status": (_enums.Status, "STRATA_"),
    "strata_type": (_enums.TensorType, "STRATA_TYPE_"),
    "strata_device": (_enums.Device, "STRATA_DEVICE_"),
    "strata_kv_type": (_enums.KvType, "STRATA_KV_"),
    "strata_lend_policy": (_enums.LendPolicy, "STRATA_LEND_"),
    "strata_miss_policy": (_enums.MissPolicy, "STRATA_MISS_"),
    "strata_cache_policy": (_enums.CachePolicy, "STRATA_CACHE_"),
    "strata_simd": (_enums.Simd, "STRATA_SIMD_"),
    "strata_split": (_enums.Split, "STRATA_SPLIT_"),
}


def header_enums() -> dict[str, dict[str, int]]:
    """enum tag -> {constant: value}, for every `typedef enum tag { ... }` of strata.h."""
    text = re.sub(r"/\*.*?\*/", "", HEADER.read_text(), flags=re.S)
    out: dict[str, dict[str, int]] = {}
    for m in re.finditer(r"typedef\s+enum\s+(\w+)\s*\{(.*?)\}", text, flags=re.S):
        values: dict[str, int] = {}
        for item in m.group(2).split(","):
            item = item.strip()
            if item:
                name, eq, value = (p.strip() for p in item.partition("="))
                assert eq, f"{m.group(1)}: {name} has no explicit value (the mirror needs one)"
                values[name] = int(value, 0)
        out[m.group(1)] = values
    return out


def test_the_header_parses_to_its_enumerations() -> None:
    enums = header_enums()
    assert enums["strata_status"]["STRATA_OK"] == 0 and enums["strata_miss_policy"]["STRATA_MISS_READ"] == 3
    assert enums["strata_type"]["STRATA_TYPE_BF16"] == 30


def test_every_enumeration_of_the_header_has_a_mirror() -> None:
    missing = set(header_enums()) - set(MIRRORS)
    assert not missing, f"strata.h enumerations without a class in strata/_enums.py: {sorted(missing)}"
    gone = set(MIRRORS) - set(header_enums())
    assert not gone, f"mirrored but no longer in strata.h: {sorted(gone)}"


@pytest.mark.parametrize("tag", sorted(MIRRORS))
def test_mirror_has_the_headers_constants_and_values(tag: str) -> None:
    cls, prefix = MIRRORS[tag]
    want = {}
    for name, value in header_enums()[tag].items():
        assert name.startswith(prefix), f"{tag}: {name} does not start with {prefix}"
        want[name.removeprefix(prefix)] = value
    got = {m.name: m.value for m in cls}
    assert got == want, f"{cls.__name__} and strata.h's {tag} differ"


def test_config_names_reach_the_engine_as_the_headers_numbers() -> None:
    p = config_to_params(
        EngineConfig(device="cpu", kv="int8", lend_policy="legacy", miss="read", simd="avx2")
    )
    assert (p.device, p.kv_type, p.lend_policy, p.miss_policy, p.simd) == (0, 1, 1, 3, 2)
    with pytest.raises(ValueError, match=r"--miss: 'sideways' is not one of auto, host, copy, read"):
        _enums.choice(_enums.MissPolicy, "sideways", "miss")


def test_every_config_field_reaches_the_params() -> None:
    """A field added to EngineConfig must be given to the engine: by the copied or the enum table, or one
    of the three fields converted by hand."""
    import dataclasses

    from strata._engine import _ENUM_PARAMS, _PLAIN_PARAMS

    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    assert fields == {
        *_PLAIN_PARAMS,
        *_ENUM_PARAMS,
        *("expert_cache", "prefill", "expert_profile", "gpus", "tensor_split", "vram_budgets"),
    }
    set_all = EngineConfig(threads=3, vram_budget=1 << 30, max_context=99, lend_floor=5, lend_pct=0.25,
                           adapt_every=7, adapt_swaps=2, adapt_decay=0.5, host_ram_budget=1 << 31,
                           vram_reserve_mib=64, parallel=4)  # fmt: skip
    p = config_to_params(set_all)
    for name, field_ in _PLAIN_PARAMS.items():
        assert getattr(p, field_) == getattr(set_all, name), name
