"""Constrained decoding on the GPU: the logits hook drives the CUDA engine step by step with the same
reply as its own loop, and a JSON schema gives valid JSON that does not depend on the expert-cache size.
"""

from __future__ import annotations

import json

import pytest

from strata import Engine, EngineConfig

pytestmark = pytest.mark.gpu

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module", autouse=True)
def _need_gpu():
    from strata import _engine

    if not _engine.cuda_available():
        pytest.skip("no CUDA device")


def test_a_schema_gives_the_same_valid_json_at_every_cache_size() -> None:
    from strata.grammar import grammars_for, json_schema_grammar
    from strata.model import ensure_model
    from strata.tokenizer import Tokenizer

    path = ensure_model("tiny", quant="q8_0", seed=0)
    tok = Tokenizer.from_gguf(path)
    g = grammars_for(tok)
    prompt = tok.encode(
        "<|im_start|>user\nPlan a trip.<|im_end|>\n<|im_start|>assistant\n", parse_special=True
    )
    stops = sorted(tok.eog_ids)
    with Engine(path, EngineConfig(device="cuda")) as eng:
        n_experts = eng.info.n_layer * eng.info.n_expert
    replies = []
    for cache in ("auto", str(n_experts // 3)):
        with Engine(path, EngineConfig(device="cuda", expert_cache=cache)) as eng:
            free = eng.generate(prompt, max_tokens=24, stop_tokens=stops)
            eng.kv_reset()
            hooked = eng.generate(prompt, max_tokens=24, stop_tokens=stops, logits_processor=lambda x: None)
            eng.kv_reset()
            assert hooked.tokens == free.tokens
            c = g.constraint(json_schema_grammar(SCHEMA), 60)
            r = eng.generate(
                prompt,
                max_tokens=60,
                stop_tokens=stops,
                logits_processor=c.mask,
                on_token=lambda t, x, c=c: not c.accept(t),
            )
            value = json.loads(tok.decode(r.tokens))
            assert set(value) == {"city", "days"} and 1 <= value["days"] <= 7
            replies.append(r.tokens)
    assert replies[0] == replies[1]
