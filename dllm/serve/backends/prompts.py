"""Request prompts -> token ids: completion prompts (text or ids) and chat messages."""

from __future__ import annotations

from typing import Any, Callable, Sequence, Union

from dllm.serve.backends.base import BadRequest

ROLES = ("system", "user", "assistant", "tool", "developer")


def text_ids(encode: Callable[[Any], list[int]], prompt: Union[str, Sequence[int]]) -> tuple[int, ...]:
    """A completion prompt (a string or a list of token ids) through the backend's encoder; its
    ValueError/TypeError (an unknown word, an id outside the vocabulary) becomes BadRequest("prompt")."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise BadRequest("prompt", "the prompt is empty")
    elif not (isinstance(prompt, (list, tuple)) and prompt
              and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
        raise BadRequest("prompt", f"prompt must be a non-empty string or a non-empty list of token ids, "
                                   f"got {type(prompt).__name__} {str(prompt)[:60]!r}")
    try:
        ids = encode(prompt if isinstance(prompt, str) else list(prompt))
    except (ValueError, TypeError, KeyError) as err:
        raise BadRequest("prompt", str(err)) from None
    if not ids:
        raise BadRequest("prompt", "the prompt encodes to no tokens")
    return tuple(int(t) for t in ids)


def check_messages(messages: Any) -> list[dict]:
    """OpenAI chat messages: a non-empty list of {"role": one of ROLES, "content": str} (content may
    also be a list of {"type": "text", "text": str} parts, joined)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise BadRequest("messages", "messages must be a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest("messages", f"messages[{i}] must be an object with a role in {', '.join(ROLES)}, "
                                         f"got {str(m)[:80]!r}")
        content = m.get("content")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise BadRequest("messages", f"messages[{i}].content: only text parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise BadRequest("messages", f"messages[{i}].content must be a string, got {type(content).__name__}")
        out.append({"role": m["role"], "content": content})
    return out


def chat_ids(tokenizer: Any, template: str, messages: Any,
             encode: Callable[[str], tuple[int, ...]]) -> tuple[int, ...]:
    """Messages rendered by the chat template (with the assistant's generation prompt), then encoded."""
    msgs = check_messages(messages)
    try:
        text = tokenizer.apply_chat_template(msgs, chat_template=template, tokenize=False,
                                             add_generation_prompt=True)
    except Exception as err:  # jinja2 errors: TemplateError, UndefinedError ...
        raise BadRequest("messages", f"the chat template failed on these messages: {err}") from None
    return encode(text)


__all__ = ["ROLES", "chat_ids", "check_messages", "text_ids"]
