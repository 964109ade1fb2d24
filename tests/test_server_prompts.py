"""Prompt building on its own: the request's text stays text through the chat template and the
tokenizer, the reply's length follows the engine's rule, and the command to the worker is typed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strata._config import generation_room
from strata.chat_template import ChatTemplate
from strata.model import ensure_model
from strata.server.errors import ApiError
from strata.server.prompts import chat_prompt, fit_max_tokens
from strata.server.protocol import GenerateCommand, ProtocolError
from strata.tokenizer import Tokenizer

TOK = Tokenizer.from_gguf(ensure_model("tiny"))
TEMPLATE = ChatTemplate(TOK.chat_template, control_tokens=TOK.control_texts)
CONTROL = {TOK.token_id(t) for t in TOK.control_texts}


def _ids(messages: list[dict[str, str]]) -> list[int]:
    return chat_prompt(TOK, TEMPLATE, {"messages": messages}, ctx=1 << 20, max_tokens=None).ids


@settings(deadline=None, max_examples=60)
@given(
    st.lists(
        st.sampled_from(
            [
                "<|im_start|>",
                "<|im_end|>",
                "<|endoftext|>",
                "system",
                "\n",
                "hi ",
                "<think>",
                "</think>",
                "<|im_",
                "\U000f0000",
                "é",
            ]
        ),
        max_size=12,
    )
)
def test_control_texts_in_a_message_stay_text(pieces: list[str]) -> None:
    content = "".join(pieces)
    msgs = [{"role": "user", "content": content}]
    ids = _ids(msgs)
    # exactly the template's control tokens: <|im_start|>user ... <|im_end|> <|im_start|>assistant
    assert [TOK.tokens[i] for i in ids if i in CONTROL] == ["<|im_start|>", "<|im_end|>", "<|im_start|>"]
    # the model reads the message verbatim
    assert TOK.decode(ids, skip_special=False) == TEMPLATE.render(msgs)
    assert content in TOK.decode(ids, skip_special=False)


def test_a_prompt_without_control_texts_is_tokenized_as_before() -> None:
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Tell me about <think> tags."},
    ]
    assert _ids(msgs) == TOK.encode(TEMPLATE.render(msgs), parse_special=True)
    p = TEMPLATE.render_prompt(msgs)
    assert p.placeholders == {} and p.text == p.masked


def test_the_reply_length_follows_the_engines_rule() -> None:
    # the last token is sampled and never stored: a prompt may fill the context and still get one token
    assert generation_room(256, 0, 256) == 1
    assert fit_max_tokens(256, None, 256, "prompt") == 1
    assert fit_max_tokens(250, None, 256, "prompt") == 7
    assert fit_max_tokens(250, 7, 256, "prompt") == 7
    with pytest.raises(ApiError) as e:
        fit_max_tokens(250, 8, 256, "prompt")
    assert e.value.code == "context_length_exceeded" and "at most 7" in e.value.message
    with pytest.raises(ApiError) as e:
        fit_max_tokens(257, None, 256, "messages")
    assert e.value.param == "messages" and "257" in e.value.message and "256" in e.value.message


def test_the_command_to_the_worker_is_typed() -> None:
    cmd = GenerateCommand(
        prompt=[1, 2, 3], max_tokens=4, temperature=0.5, stop_tokens=[9], cache_scope="key0/"
    )
    msg = cmd.to_message()
    assert msg["op"] == "generate" and GenerateCommand.from_message(msg) == cmd
    with pytest.raises(ProtocolError, match="unknown fields want_logprobs"):
        GenerateCommand.from_message({**msg, "want_logprobs": True})
    with pytest.raises(ProtocolError, match="max_tokens"):
        GenerateCommand.from_message({"op": "generate", "prompt": [1]})
