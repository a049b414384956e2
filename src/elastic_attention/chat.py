"""Rendering one question-answer turn with a tokenizer's chat template, as token ids.

Training (answer-only labels) and the suites' evaluation render rows the same way: an optional system turn, the user
turn with the generation prompt, then the assistant's answer as the template writes it (its end-of-turn tokens
included). With no system text no system message is passed, so a template that writes a default system turn of its
own (Qwen2.5's) still does.
"""

from __future__ import annotations

from elastic_attention.errors import InputError


def _messages(prompt: str, system: str, answer: str | None = None) -> list[dict[str, str]]:
    """The conversation: the system turn (when ``system``), the user turn, the assistant turn (when ``answer`` is
    not None)."""
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    if answer is not None:
        messages.append({"role": "assistant", "content": answer})
    return messages


def _apply(tokenizer, messages: list[dict[str, str]], *, add_generation_prompt: bool,
           continue_final_message: bool = False) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the tokenizer has no chat template; set tokenizer.chat_template to render rows")
    options = {"tokenize": False, "add_generation_prompt": add_generation_prompt}
    if continue_final_message:  # an assistant turn left open, for the answer to continue it
        options["continue_final_message"] = True
    if messages[0]["role"] != "system":
        return tokenizer.apply_chat_template(messages, **options)
    from jinja2 import TemplateError

    try:
        return tokenizer.apply_chat_template(messages, **options)
    except TemplateError as error:
        raise InputError(f"the chat template refuses a system turn ({error}); use rows without a system prompt "
                         "(the broad suite: generate with system=False)") from None


def render_prompt(tokenizer, prompt: str, system: str = "", *, assistant_prefix: str = "") -> str:
    """``prompt`` as a user turn (after a system turn when ``system`` is not empty) plus the generation prompt, as
    text; with ``assistant_prefix``, the assistant turn begun with that text instead of the bare generation prompt
    (the template's ``continue_final_message``, as lm-eval renders a task's ``gen_prefix``).

    Raises:
        InputError: the tokenizer has no chat template, or its template refuses a system turn.
    """
    if assistant_prefix:
        return _apply(tokenizer, _messages(prompt, system, assistant_prefix), add_generation_prompt=False,
                      continue_final_message=True)
    return _apply(tokenizer, _messages(prompt, system), add_generation_prompt=True)


def encode_prompt(tokenizer, prompt: str, system: str = "", *, assistant_prefix: str = "") -> list[int]:
    """Token ids of `render_prompt` (what generation starts from).

    Raises:
        InputError: the tokenizer has no chat template, or its template refuses a system turn.
    """
    return tokenizer.encode(render_prompt(tokenizer, prompt, system, assistant_prefix=assistant_prefix),
                            add_special_tokens=False)


def encode_chat(tokenizer, prompt: str, answer: str, system: str = "", *,
                assistant_prefix: str = "") -> tuple[list[int], list[int]]:
    """Token ids of ``prompt`` as a user turn plus the generation prompt, and of the answer turn that follows.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        prompt: the user message.
        answer: the assistant message.
        system: the system message; empty for none.
        assistant_prefix: text the assistant turn starts with, part of the prompt; the answer follows it after a
            space.

    Returns:
        ``(prompt_ids, answer_ids)``; ``prompt_ids + answer_ids`` is the whole conversation rendered by the template.

    Raises:
        InputError: the tokenizer has no chat template, its template refuses a system turn, or the rendered answer
            turn does not extend the prompt.
    """
    prompt_ids = encode_prompt(tokenizer, prompt, system, assistant_prefix=assistant_prefix)
    reply = f"{assistant_prefix} {answer}" if assistant_prefix else answer
    conversation = _apply(tokenizer, _messages(prompt, system, reply), add_generation_prompt=False)
    full_ids = tokenizer.encode(conversation, add_special_tokens=False)
    if full_ids[: len(prompt_ids)] != prompt_ids or len(full_ids) == len(prompt_ids):
        raise InputError(
            "the chat template's answer turn does not extend the prompt with a generation prompt; "
            "answer-only labels need a template where prompt + answer starts with the rendered prompt"
        )
    return prompt_ids, full_ids[len(prompt_ids) :]
