"""The engine's C enumerations (native/include/strata.h) as Python IntEnums: the one place their numbers
are written on the Python side. tests/test_enums.py parses the header and checks every value.

A member's name is the C constant's without its prefix (``STRATA_MISS_READ`` is ``MissPolicy.READ``);
for the options a user names on the command line (``--miss read``), :func:`choice` maps the lower-case
name to its member.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TypeVar


class Status(IntEnum):
    """strata_status_t: what every engine call returns."""

    OK = 0
    ERR_INVALID_ARGUMENT = 1
    ERR_IO = 2
    ERR_FORMAT = 3
    ERR_UNSUPPORTED = 4
    ERR_OUT_OF_MEMORY = 5
    ERR_BUDGET = 6
    ERR_CONTEXT = 7
    ERR_LEND = 8
    ERR_CANCELLED = 9
    ERR_DEVICE = 10
    ERR_INTERNAL = 11
    ERR_STATE = 12


class TensorType(IntEnum):
    """strata_type_t: tensor storage types, numbered as GGUF numbers them."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ2_XXS = 16
    IQ2_XS = 17
    IQ3_XXS = 18
    IQ1_S = 19
    IQ4_NL = 20
    IQ3_S = 21
    IQ2_S = 22
    IQ4_XS = 23
    IQ1_M = 29
    BF16 = 30
    MXFP4 = 39


class Device(IntEnum):
    """strata_device_t (``--device``)."""

    CPU = 0
    CUDA = 1
    AUTO = 2


class KvType(IntEnum):
    """strata_kv_type_t (``--kv``)."""

    F16 = 0
    INT8 = 1


class LendPolicy(IntEnum):
    """strata_lend_policy_t (``--lend-policy``)."""

    CURRENT = 0
    LEGACY = 1


class MissPolicy(IntEnum):
    """strata_miss_policy_t (``--miss``)."""

    AUTO = 0
    HOST = 1
    COPY = 2
    READ = 3


class CachePolicy(IntEnum):
    """strata_cache_policy_t (``--cache-policy``)."""

    ADAPTIVE = 0
    LRU = 1


class Simd(IntEnum):
    """strata_simd_t (``--simd``)."""

    AUTO = 0
    SCALAR = 1
    AVX2 = 2
    AVX512 = 3


class Split(IntEnum):
    """strata_split_t (``--split``)."""

    NONE = 0
    LAYER = 1


E = TypeVar("E", bound=IntEnum)


def names(enum: type[IntEnum]) -> tuple[str, ...]:
    """The lower-case names a user gives for an option's values, in the header's order."""
    return tuple(m.name.lower() for m in enum)


def choice(enum: type[E], value: str, flag: str) -> E:
    """The member named ``value`` (lower case); ValueError naming ``--flag`` and the choices otherwise."""
    if not isinstance(value, str) or value not in names(enum):
        raise ValueError(f"--{flag}: {value!r} is not one of {', '.join(names(enum))}")
    return enum[value.upper()]
