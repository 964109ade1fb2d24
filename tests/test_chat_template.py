"""Chat templates: the model's own, rendered in a sandbox; the fallback; thinking on and off."""

from __future__ import annotations

import pytest

from strata.chat_template import FALLBACK_TEMPLATE, ChatTemplate, ChatTemplateError
from strata.tokenizer import Tokenizer

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def template(tiny_tok: Tokenizer) -> ChatTemplate:
    tok = tiny_tok
    return ChatTemplate(tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token)


def test_model_template_renders_turns_and_generation_prompt(template: ChatTemplate) -> None:
    assert not template.is_fallback and template.supports_thinking
    text = template.render(MSGS)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert not template.render(MSGS, add_generation_prompt=False).endswith("assistant\n")


def test_thinking_switch_and_reasoning_effort(template: ChatTemplate) -> None:
    on = template.render(MSGS, enable_thinking=True)
    off = template.render(MSGS, enable_thinking=False)
    assert off == on + "<think>\n\n</think>\n\n"
    assert template.render(MSGS, reasoning_effort="none") == off
    assert template.render(MSGS, reasoning_effort="high") == on


def test_content_parts_and_developer_role(template: ChatTemplate) -> None:
    parts = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
    ]
    assert template.render(parts) == template.render(MSGS)


@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ([], "messages"),
        ("hello", "messages"),
        ([{"role": "wizard", "content": "x"}], "messages[0].role"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            "messages[0].content[0]",
        ),
    ],
)
def test_bad_messages_name_the_field(template: ChatTemplate, messages: object, where: str) -> None:
    with pytest.raises(ChatTemplateError) as e:
        template.render(messages)
    assert str(e.value).startswith(where)


def test_fallback_template_when_the_file_has_none() -> None:
    t = ChatTemplate(None)
    assert t.is_fallback and t.source == FALLBACK_TEMPLATE
    assert (
        t.render([{"role": "user", "content": "yo"}])
        == "<|im_start|>user\nyo<|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_errors_and_sandbox() -> None:
    strict = ChatTemplate(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}"
        "{{ messages[0].content }}"
    )
    with pytest.raises(ChatTemplateError, match="first must be user"):
        strict.render([{"role": "system", "content": "x"}])
    assert strict.render([{"role": "user", "content": "ok"}]) == "ok"
    # a template cannot reach Python internals
    evil = ChatTemplate("{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError):
        evil.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
    # tojson keeps text as it is; tools and extra variables reach the template
    t = ChatTemplate("{{ tools | tojson }}|{{ custom }}")
    assert (
        t.render([{"role": "user", "content": "x"}], tools=[{"name": "é"}], extra={"custom": 7})
        == '[{"name": "é"}]|7'
    )
