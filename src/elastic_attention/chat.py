"""Rendering one question-answer turn with a tokenizer's chat template, as token ids.

Training (answer-only labels) and the code suite's evaluation render rows the same way: the user turn with the
generation prompt, then the assistant's answer as the template writes it (its end-of-turn tokens included).
"""

from __future__ import annotations

from elastic_attention.errors import InputError


def render_prompt(tokenizer, prompt: str) -> str:
    """``prompt`` as a user turn plus the generation prompt, as text.

    Raises:
        InputError: the tokenizer has no chat template.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise InputError("the tokenizer has no chat template; set tokenizer.chat_template to render rows")
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)


def encode_prompt(tokenizer, prompt: str) -> list[int]:
    """Token ids of `render_prompt` (what generation starts from).

    Raises:
        InputError: the tokenizer has no chat template.
    """
    return tokenizer.encode(render_prompt(tokenizer, prompt), add_special_tokens=False)


def encode_chat(tokenizer, prompt: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of ``prompt`` as a user turn plus the generation prompt, and of the answer turn that follows.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        prompt: the user message.
        answer: the assistant message.

    Returns:
        ``(prompt_ids, answer_ids)``; ``prompt_ids + answer_ids`` is the whole conversation rendered by the template.

    Raises:
        InputError: the tokenizer has no chat template, or the rendered answer turn does not extend the prompt.
    """
    prompt_ids = encode_prompt(tokenizer, prompt)
    conversation = [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
    full_ids = tokenizer.encode(tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)
    if full_ids[: len(prompt_ids)] != prompt_ids or len(full_ids) == len(prompt_ids):
        raise InputError(
            "the chat template's answer turn does not extend the prompt with a generation prompt; "
            "answer-only labels need a template where prompt + answer starts with the rendered prompt"
        )
    return prompt_ids, full_ids[len(prompt_ids) :]
