"""One engine run on the GPU for test_cuda_portable.py, in a process of its own (the driver reads
CUDA_FORCE_PTX_JIT when it starts): ``python -m tests.gpu._portable_run MODEL OUT.npz [KV]`` (KV: the
``--kv`` cache type, f16 unless given).

Prefills a prompt, keeps the logits of its last token, then generates 16 tokens greedily from the
same prompt, keeping every token's logits. Writes them to OUT.npz and prints one JSON line: the
tokens and the engine's trace line naming the code path (``cuda: ... runs code built for sm_NN ...``).
"""

from __future__ import annotations

import json
import sys

import numpy as np


def main(model: str, out: str, kv: str = "f16") -> None:
    from strata import Engine, EngineConfig

    trace: list[str] = []
    with Engine(model, EngineConfig(device="cuda", kv=kv), trace=trace.append) as eng:
        vocab = eng.info.n_vocab
        prompt = [int(t) for t in np.random.default_rng(7).integers(10, vocab - 10, size=150)]
        eng.prefill(prompt)
        prompt_logits = eng.logits()
        eng.kv_reset()
        steps: list[np.ndarray] = []
        res = eng.generate(
            prompt,
            max_tokens=16,
            stop_at_eos=False,
            on_token=lambda _t, logits: steps.append(np.array(logits, copy=True)),
        )
    np.savez(out, prompt_logits=prompt_logits, decode_logits=np.stack(steps))
    path = [line for line in trace if "runs code built for" in line]
    print(json.dumps({"tokens": res.tokens, "code_path": path[0] if path else ""}))


if __name__ == "__main__":
    main(*sys.argv[1:4])
