"""GPU microbenchmark: the one-token matrix-vector product (cuda_matvec, T = 1, the decode kernel) per weight
type, as GB/s of weights read, against the device copy's 4.2 TB/s (docs: /work/shared/GPU.md).

    python3 tests/gpu/bench_matvec.py                 # 32768 x 4096 and expert-sized 768 x 2048 / 2048 x 768
    python3 tests/gpu/bench_matvec.py --reps 50 --types Q4_K,Q6_K

Each timing is one launch plus a synchronize (strata_cuda_bench_matvec: the median of --reps after three
warm-up runs), so a small matrix's figure includes the launch latency (about 5-10 us); the large matrix
(75-142 MB, above the 50 MB L2) shows the kernel's bandwidth, the expert-sized ones (about 1 MB, L2-resident
after the warm-up) what a decode step sees per launch.
"""

from __future__ import annotations

import argparse
import ctypes
import json

import numpy as np

from tests.gpu._cuda_util import cuda_lib, random_rows

TYPES = {"F16": 1, "Q8_0": 8, "Q4_0": 2, "Q4_K": 12, "Q6_K": 14}
SHAPES = [(32768, 4096), (768, 2048), (2048, 768)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    lib = cuda_lib()
    rng = np.random.default_rng(0)
    rows_out = []
    for rows, cols in SHAPES:
        for name in a.types.split(","):
            # random rows (valid scales) for up to 256 rows, repeated: the bytes' values do not matter here
            base, _ = random_rows(name, min(rows, 256), cols, rng)
            w = np.ascontiguousarray(np.tile(base, (rows // base.shape[0] + 1, 1))[:rows])
            us = ctypes.c_double(0.0)
            st = lib.strata_cuda_bench_matvec(
                TYPES[name], w.ctypes.data_as(ctypes.c_void_p), rows, cols, 1, a.reps, ctypes.byref(us)
            )
            if st != 0:
                print(f"{name} {rows}x{cols}: status {st}")
                continue
            row = {"type": name, "rows": rows, "cols": cols, "MB": w.nbytes / 1e6, "us": us.value}
            row["GB_s"] = w.nbytes / us.value / 1e3
            rows_out.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{'type':<6} {'shape':>12} {'MB':>8} {'us':>9} {'GB/s':>8} {'of 4.2 TB/s':>11}")
    for r in rows_out:
        shape = f"{r['rows']}x{r['cols']}"
        print(
            f"{r['type']:<6} {shape:>12} {r['MB']:>8.2f} {r['us']:>9.1f} {r['GB_s']:>8.0f} {r['GB_s'] / 4200:>10.0%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
