"""Prompts of a ``DiffusionLM``: its chat template, rendering chat messages, and prompt token ids.

``PromptsMixin`` is a base of ``dllm.models.base.DiffusionLM``; it reads the model's ``tokenizer``,
``default_chat_template``, ``family`` and ``name_or_path``.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Sequence, Union

Messages = Sequence[dict[str, str]]


class PromptsMixin:
    """The prompt half of ``DiffusionLM``."""

    tokenizer: Any
    default_chat_template: Optional[str]
    family: str
    name_or_path: Optional[str]

    @property
    def chat_template(self) -> Optional[str]:
        """The tokenizer's own chat template, else the family default (None if neither exists)."""
        own = getattr(self.tokenizer, "chat_template", None)
        return own if isinstance(own, str) and own else self.default_chat_template

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"this {self.family or type(self).__name__} model has no tokenizer; pass "
                             "token ids, or load a checkpoint that ships tokenizer files")
        return self.tokenizer

    @property
    def display_name(self) -> str:
        """``model 'tiny-llada'`` for a loaded model, else ``this llada model``."""
        return f"model {self.name_or_path!r}" if self.name_or_path else f"this {self.family or type(self).__name__} model"

    def usable_chat_template(self, hint: str = "pass chat=False and a raw prompt") -> str:
        """The chat template, or a ValueError naming the model when it has no usable one: its tokenizer
        ships none and the family defines none, or the family's default needs special tokens
        (``<|im_start|>``, ...) that the tokenizer's vocabulary lacks (the embedded task models' word
        vocabularies), where rendering it would only give words the tokenizer does not know. ``hint``
        ends the message: what the caller's user can do instead (the CLI's flags, the server's)."""
        tok = self._require_tokenizer()
        template = self.chat_template
        if template is None:
            raise ValueError(f"{self.display_name} has no chat template: its tokenizer has none and family "
                             f"{self.family!r} defines no default; {hint}")
        if template is self.default_chat_template:
            vocab = tok.get_vocab()
            missing = [t for t in dict.fromkeys(re.findall(r"<\|[^|<>]+\|>", template)) if t not in vocab]
            if missing:
                raise ValueError(
                    f"{self.display_name} has no chat template: its tokenizer has none, and the {self.family} "
                    f"default template needs the tokens {', '.join(map(repr, missing))}, which its "
                    f"{len(vocab)}-entry vocabulary lacks; {hint}")
        return template

    def render_chat(self, messages: Messages) -> str:
        """Chat messages -> the templated prompt string, ending with the assistant header
        (ValueError naming the model when it has no usable template: ``usable_chat_template``)."""
        tok = self._require_tokenizer()
        template = self.usable_chat_template()
        return tok.apply_chat_template(list(messages), chat_template=template, tokenize=False,
                                       add_generation_prompt=True)

    def generation_prompt(self, text_or_messages: Union[str, Messages], chat: bool = False) -> list[int]:
        """Token ids of a prompt. chat=True wraps a string as one user turn (or takes a list of
        {"role", "content"} messages) and applies the chat template; tokenised without adding
        special tokens (the template already has them). Words the tokenizer does not know are a
        ValueError naming them (``tokenizer.encode_text``), never its unknown token."""
        from dllm.models.text.tokenizer import encode_text

        tok = self._require_tokenizer()
        if chat:
            messages = ([{"role": "user", "content": text_or_messages}]
                        if isinstance(text_or_messages, str) else list(text_or_messages))
            text = self.render_chat(messages)
        elif isinstance(text_or_messages, str):
            text = text_or_messages
        else:
            raise ValueError("a list of chat messages needs chat=True; pass a string for a raw prompt")
        return encode_text(tok, text)
