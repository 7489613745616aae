"""The ChatML chat template (the one Qwen2.5 uses, without its default system message)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

One renderer for both sides: the simulator renders requests with it, and the load generator's
local-tokenizer counter counts chat prompts with it, so the two agree on every chat prompt.
"""
from __future__ import annotations

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


class ChatTemplateError(ValueError):
    """A message list the template cannot render (the simulator answers 400)."""


def render_chat(messages, add_generation_prompt: bool = True) -> str:
    """ChatML rendering of OpenAI-style messages; content may be a string or a list of parts."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("'messages' must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string 'role'")
        out.append(f"{IM_START}{m['role']}\n{message_text(m.get('content'), i)}{IM_END}\n")
    if add_generation_prompt:
        out.append(f"{IM_START}assistant\n")
    return "".join(out)


def message_text(content, index: int = 0) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(
                part.get("text"), str
            ):
                parts.append(part["text"])
            else:
                raise ChatTemplateError(
                    f"messages[{index}].content: only text parts are supported by the simulator"
                )
        return "\n".join(parts)
    raise ChatTemplateError(f"messages[{index}].content must be a string or a list of text parts")
