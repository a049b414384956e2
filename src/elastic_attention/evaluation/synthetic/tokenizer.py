"""The synthetic suite's word-level Hugging Face tokenizer, its chat template, and a row rendered as text.

Every word the suite can produce is one token: the tokenizer is a ``tokenizers`` WordLevel model behind a
whitespace-split pre-tokenizer, so "number of tokens" and "number of whitespace-separated words" are the same thing
for every generated text. That is what lets the suite hit a requested prompt length exactly.

The chat template renders one user turn as ``<bos> <user> {prompt} <assistant>`` (the generation prompt) and an
assistant answer as `` {answer} <eos>``. A rendered prompt therefore has :data:`CHAT_PROMPT_OVERHEAD_TOKENS` (3)
tokens more than the prompt itself.

``transformers`` and ``tokenizers`` are imported only inside the functions that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_attention.evaluation.synthetic.words import (
    ASSISTANT_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    SYSTEM_TOKEN,
    UNK_TOKEN,
    USER_TOKEN,
    vocabulary,
)

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedTokenizerFast

    from elastic_attention.rows import Row

#: Tokens the chat template adds around one user prompt with the generation prompt: ``<bos> <user> ... <assistant>``.
CHAT_PROMPT_OVERHEAD_TOKENS = 3

#: Jinja chat template. Every token is separated by a space so that whitespace splitting recovers it.
CHAT_TEMPLATE = (
    "{{ bos_token }} "
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' %} <system> {{ message['content'] }}"
    "{%- elif message['role'] == 'user' %} <user> {{ message['content'] }}"
    "{%- elif message['role'] == 'assistant' %} <assistant> {{ message['content'] }} {{ eos_token }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %} <assistant>{% endif %}"
)

def build_tokenizer() -> PreTrainedTokenizerFast:
    """Build the suite's word-level tokenizer with its chat template.

    The tokenizer is a ``tokenizers`` WordLevel model over :func:`vocabulary` with a whitespace-split
    pre-tokenizer, no normalizer and no post-processor (the chat template writes ``<bos>`` itself, so encoding a
    rendered prompt never adds tokens). Decoding joins tokens with single spaces; ``clean_up_tokenization_spaces``
    is off so that ``" ."`` stays ``" ."``. ``save_pretrained`` writes ``tokenizer.json``,
    ``tokenizer_config.json`` and the chat template, which ``AutoTokenizer.from_pretrained`` loads offline.

    Returns:
        A ``transformers.PreTrainedTokenizerFast`` with ``pad``/``unk``/``bos``/``eos`` tokens set, the role
        markers as extra special tokens, ``chat_template`` set and ``model_max_length`` of 2**20 tokens.
    """
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = vocabulary()
    backend = Tokenizer(models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        extra_special_tokens=[SYSTEM_TOKEN, USER_TOKEN, ASSISTANT_TOKEN],
        clean_up_tokenization_spaces=False,
        model_max_length=2**20,
        padding_side="left",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def render_prompt(tokenizer: PreTrainedTokenizerFast, row: Row) -> str:
    """Render a row's prompt as one user turn plus the generation prompt.

    Args:
        tokenizer: a tokenizer from :func:`build_tokenizer` (or reloaded from its ``save_pretrained`` directory).
        row: the task row.

    Returns:
        ``"<bos> <user> {instruction} {context} {question} <assistant>"`` (newlines of the prompt kept); it encodes
        to exactly ``row.metadata["length"]`` tokens.
    """
    messages = [{"role": "user", "content": row.prompt}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_answer(tokenizer: PreTrainedTokenizerFast, row: Row) -> str:
    """The text that follows :func:`render_prompt` in a full conversation: the answer, then ``<eos>``.

    Args:
        tokenizer: the suite tokenizer (its ``eos_token`` is used).
        row: the task row.

    Returns:
        ``" {answer} <eos>"``; ``render_prompt(...) + render_answer(...)`` tokenizes like the chat template applied to
        the user turn plus the assistant answer.
    """
    return f" {row.answer} {tokenizer.eos_token}"


def decode_answer(tokenizer: PreTrainedTokenizerFast, token_ids: list[int]) -> str:
    """Decode generated answer ids: stop at the first ``<eos>``, drop special tokens, single-space the words.

    Args:
        tokenizer: the suite tokenizer.
        token_ids: ids generated after the prompt, ``[new_tokens]``.

    Returns:
        The answer text, e.g. ``"v12 v40"``; compare it with :func:`elastic_attention.evaluation.synthetic.score`.
    """
    ids = list(token_ids)
    if tokenizer.eos_token_id in ids:
        ids = ids[: ids.index(tokenizer.eos_token_id)]
    return " ".join(tokenizer.decode(ids, skip_special_tokens=True).split())
