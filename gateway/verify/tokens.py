"""Exact-mode tokenization for the detective audit: the model's own tokenizer and chat template
(a Hugging Face directory named by the policy), rendering a request the way the server does.

Invariant: the result is used only when its token count equals the prompt tokens the server
reports for the same request; any disagreement falls back to the sound upper bound. Every
tokenizer a policy names is loaded when the gateway starts (`load_problem`): one that cannot be
is a one-line refusal then, never an error inside a request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import orjson

from gateway.inputs.paths import COMPLETIONS
from gateway.policy.model import Policy
from gateway.verify import render

EXTRA: Final = "pip install 'kvfence[gateway,tokenizer]'"


class TokenizerError(ValueError):
    """The tokenizer directory cannot be used (named in the policy, checked at load)."""


class ChatTokenizer:
    def __init__(self, folder: Path) -> None:
        try:
            import jinja2.sandbox
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TokenizerError(f"exact mode needs {exc.name}: {EXTRA}") from exc
        try:
            # `tokenizers` raises a bare Exception for a file it cannot parse
            self._tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
            config = _config(folder)
        except Exception as exc:  # re-raised as the one error callers know
            raise TokenizerError(f"{folder}: cannot load the tokenizer: {exc}") from exc
        source = _template(folder, config)
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        try:
            self._template = env.from_string(source) if source else None
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"{folder}: cannot load the chat template: {exc}") from exc
        self._errors = jinja2.TemplateError
        self._specials = {
            k: _token_text(config.get(k)) for k in ("bos_token", "eos_token", "unk_token")
        }

    def prompt_ids(self, path: str, body: dict[str, Any]) -> list[int] | None:
        """The prompt ids of a request as the server renders it (chat and Responses through
        the chat template, a completions prompt as text or as the ids it already is), or None
        when it cannot be rendered here exactly (tools, images, a batch of prompts)."""
        if path == COMPLETIONS:
            prompt = render.completion_prompt(body)
            return self.text_ids(prompt) if isinstance(prompt, str) else prompt
        conversation = render.messages(path, body)
        if conversation is None or not render.plain_messages(path, body):
            return None
        return self.chat_ids(conversation)

    def chat_text(self, messages: list[dict[str, Any]]) -> str | None:
        """A chat request's prompt as the server renders it, or None when the template cannot
        render it here."""
        if self._template is None:
            return None
        try:
            return str(
                self._template.render(
                    messages=messages, add_generation_prompt=True, **self._specials
                )
            )
        except (self._errors, TypeError, ValueError, LookupError, AttributeError):
            return None  # a request this template cannot render: the caller uses the bound

    def chat_ids(self, messages: list[dict[str, Any]]) -> list[int] | None:
        """The prompt ids of a chat request, or None when it cannot be rendered here."""
        text = self.chat_text(messages)
        return None if text is None else list(self._tok.encode(text, add_special_tokens=False).ids)

    def text_ids(self, text: str, special: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=special).ids)


def load_problem(policy: Policy) -> str | None:
    """One line saying why a tokenizer the policy names (`verify.detective.tokenizer`) cannot
    be loaded, or None when every one can."""
    for backend in policy.backends:
        detective = backend.verify.detective if backend.verify is not None else None
        if detective is None or detective.tokenizer is None:
            continue
        try:
            ChatTokenizer(detective.tokenizer)
        except TokenizerError as exc:
            return f"backends[{backend.name}].verify.detective.tokenizer: {exc}"
    return None


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    data = orjson.loads(path.read_bytes())
    return data if isinstance(data, dict) else {}


def _template(folder: Path, config: dict[str, Any]) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    return template if isinstance(template, str) else None


def _token_text(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return value if isinstance(value, str) else ""
