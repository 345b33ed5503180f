"""Renders a model's chat template (Jinja, as shipped in GGUF metadata or tokenizer_config.json).

Invariant: templates run in jinja2's immutable sandbox; a template error is a ChatTemplateError,
never a crash of the caller.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NoReturn

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used only when a model ships no template of its own.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ChatTemplateError(ValueError):
    """The template raised or could not be rendered for these messages."""


def _raise_exception(message: str) -> NoReturn:
    raise ChatTemplateError(message)


class ChatTemplate:
    def __init__(self, source: str | None, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        try:
            self._template = env.from_string(source or CHATML_TEMPLATE)
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template does not parse: {exc}") from exc
        self.source = source or CHATML_TEMPLATE
        self._bos = bos_token
        self._eos = eos_token

    def render(
        self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True
    ) -> str:
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
