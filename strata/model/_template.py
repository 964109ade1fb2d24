"""The chat template stored in made models (``tokenizer.chat_template``), in Qwen3's message format.

Turns are ``<|im_start|>ROLE\\n...<|im_end|>\\n``. Reasoning is wrapped in ``<think>...</think>``: it is
kept for assistant turns after the last user message and dropped from earlier ones. With
``enable_thinking=False`` the generation prompt ends with an empty think block, so the model answers
directly. Tool results are sent as a user turn inside ``<tool_response>`` tags.
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT_TEMPLATE", "render_chat"]

CHAT_TEMPLATE = """\
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- for m in messages -%}
  {%- set text = m.content if m.content is string else '' -%}
  {%- if m.role == 'system' or m.role == 'user' -%}
{{ '<|im_start|>' + m.role + '\\n' + text + '<|im_end|>\\n' }}
  {%- elif m.role == 'assistant' -%}
    {%- set reasoning = m.reasoning_content if m.reasoning_content is string else '' -%}
    {%- if '</think>' in text -%}
      {%- if not reasoning -%}
        {%- set reasoning = text.split('</think>')[0].split('<think>')[-1] -%}
      {%- endif -%}
      {%- set text = text.split('</think>')[-1] -%}
    {%- endif -%}
    {%- set reasoning = reasoning.strip('\\n') -%}
    {%- set text = text.lstrip('\\n') -%}
    {%- if loop.index0 > ns.last_user and reasoning -%}
{{ '<|im_start|>assistant\\n<think>\\n' + reasoning + '\\n</think>\\n\\n' + text + '<|im_end|>\\n' }}
    {%- else -%}
{{ '<|im_start|>assistant\\n' + text + '<|im_end|>\\n' }}
    {%- endif -%}
  {%- elif m.role == 'tool' -%}
{{ '<|im_start|>user\\n<tool_response>\\n' + text + '\\n</tool_response><|im_end|>\\n' }}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{ '<|im_start|>assistant\\n' }}
  {%- if enable_thinking is defined and enable_thinking is false -%}
{{ '<think>\\n\\n</think>\\n\\n' }}
  {%- endif -%}
{%- endif -%}
"""


def render_chat(
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    enable_thinking: bool | None = None,
    template: str = CHAT_TEMPLATE,
) -> str:
    """Render ``messages`` with ``template`` in a jinja2 sandbox (as a server would)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    kwargs: dict[str, Any] = {"messages": messages, "add_generation_prompt": add_generation_prompt}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    return env.from_string(template).render(**kwargs)
