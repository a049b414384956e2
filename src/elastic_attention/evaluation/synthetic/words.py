"""The word inventory of the synthetic task suite: every word it can produce, each one token.

The inventory (about 915 types, padded to a model vocabulary of 1024 by the pretraining recipe,
`elastic_attention.training.backbone`) is:

- special tokens: ``<pad> <unk> <bos> <eos> <system> <user> <assistant>``;
- punctuation and markers: ``. , : ? = ##`` and the words of the needle formats;
- key tokens ``k0 .. k199``, value tokens ``v0 .. v199``, variable tokens ``x0 .. x99``, numbers ``0 .. 31``;
- colour words, used only by the counting task;
- filler words (determiners, topic nouns, shared nouns, verbs, adjectives, adverbs, prepositions);
- the words of the task instructions and questions.

:func:`vocabulary` gives them in id order; :mod:`elastic_attention.evaluation.synthetic.tokenizer` builds the
tokenizer over them. Standard library only.
"""

from __future__ import annotations

from typing import Any

PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
BOS_TOKEN = "<bos>"
EOS_TOKEN = "<eos>"
SYSTEM_TOKEN = "<system>"
USER_TOKEN = "<user>"
ASSISTANT_TOKEN = "<assistant>"

#: Special tokens in id order: ``<pad>`` is id 0, ``<unk>`` id 1, ``<bos>`` id 2, ``<eos>`` id 3.
SPECIAL_TOKENS: tuple[str, ...] = (
    PAD_TOKEN,
    UNK_TOKEN,
    BOS_TOKEN,
    EOS_TOKEN,
    SYSTEM_TOKEN,
    USER_TOKEN,
    ASSISTANT_TOKEN,
)

# Needle and marker words. Filler never uses them, so a parser can find every needle by its marker.
NEEDLE_MARKER = "remember"  # "remember k17 v42 ." : a key/value needle (key directly followed by its value)
NOTE_MARKER = "note"  # "note k17 v42 ." : the local fact of local_recall
SEQUENCE_MARKER = "sequence"  # "sequence : v3 v7 v3 v7 ." : the pattern of local_pattern
VARIABLE_MARKER = "VAR"  # "VAR x3 = v17 ." / "VAR x8 = x3 ." : variable_tracking assignments
QUERY_MARKER = "ask"  # "ask k17 v42 ." : an inline queried needle (dense pretraining sequences only)
PARAGRAPH_MARKER = "##"  # first token of every paragraph
PUNCTUATION: tuple[str, ...] = (".", ",", ":", "?", "=", PARAGRAPH_MARKER)
MARKER_WORDS: tuple[str, ...] = (NEEDLE_MARKER, NOTE_MARKER, SEQUENCE_MARKER, VARIABLE_MARKER, QUERY_MARKER)

NUM_KEYS = 200
NUM_VALUES = 200
NUM_VARIABLES = 100
NUM_NUMBERS = 32
KEY_TOKENS: tuple[str, ...] = tuple(f"k{i}" for i in range(NUM_KEYS))
VALUE_TOKENS: tuple[str, ...] = tuple(f"v{i}" for i in range(NUM_VALUES))
VARIABLE_TOKENS: tuple[str, ...] = tuple(f"x{i}" for i in range(NUM_VARIABLES))
NUMBER_TOKENS: tuple[str, ...] = tuple(str(i) for i in range(NUM_NUMBERS))

#: Words counted by local_count. They occur nowhere but in the last paragraph of a local_count context.
COLOR_WORDS: tuple[str, ...] = (
    "red", "blue", "green", "yellow", "purple", "orange", "black", "white", "pink", "brown",
)  # fmt: skip

DETERMINERS: tuple[str, ...] = ("the", "a", "this", "that", "every", "some", "each", "another")

#: Topic -> nouns. A filler paragraph draws most of its nouns from one topic.
TOPIC_NOUNS: dict[str, tuple[str, ...]] = {
    "harbor": ("ship", "boat", "sailor", "anchor", "wave", "dock", "rope", "gull", "tide", "lighthouse"),
    "forest": ("tree", "fox", "owl", "branch", "leaf", "moss", "deer", "path", "stream", "mushroom"),
    "kitchen": ("cook", "pot", "oven", "bread", "spoon", "knife", "soup", "kettle", "table", "apron"),
    "city": ("street", "tower", "bus", "driver", "bridge", "market", "crowd", "lantern", "square", "clerk"),
    "farm": ("farmer", "cow", "barn", "field", "goat", "plow", "hay", "fence", "horse", "tractor"),
    "school": ("teacher", "pupil", "book", "desk", "lesson", "chalk", "bell", "map", "pencil", "exam"),
    "mountain": ("peak", "climber", "cliff", "snow", "glacier", "ridge", "cave", "eagle", "stone", "valley"),
    "library": ("shelf", "reader", "page", "scroll", "archive", "ledger", "author", "chapter", "poem", "candle"),
    "workshop": ("hammer", "nail", "carpenter", "saw", "plank", "bench", "drill", "glue", "chisel", "ladder"),
    "garden": ("rose", "gardener", "seed", "bee", "pond", "hedge", "tulip", "fountain", "shovel", "worm"),
    "theater": ("actor", "stage", "curtain", "mask", "singer", "audience", "ticket", "costume", "script", "drum"),
    "station": ("train", "engine", "platform", "clock", "traveler", "whistle", "track", "trunk", "porter", "wagon"),
    "sky": ("cloud", "star", "moon", "comet", "rain", "storm", "thunder", "rainbow", "kite", "balloon"),
    "market": ("merchant", "basket", "coin", "stall", "fruit", "cheese", "scale", "buyer", "sack", "barrel"),
}  # fmt: skip

SHARED_NOUNS: tuple[str, ...] = (
    "man", "woman", "child", "friend", "stranger", "king", "queen", "doctor", "soldier", "guard",
    "dog", "cat", "bird", "house", "door", "window", "wall", "road", "river", "hill",
    "letter", "box", "chair", "lamp", "garden", "bag", "cup", "hat", "coat", "wheel",
)  # fmt: skip

VERBS: tuple[str, ...] = (
    "sees", "finds", "carries", "paints", "moves", "watches", "builds", "follows", "lifts", "pulls",
    "pushes", "cleans", "holds", "opens", "closes", "drops", "breaks", "fixes", "likes", "visits",
    "greets", "praises", "throws", "catches", "covers", "feeds", "guards", "leaves", "meets", "passes",
    "reaches", "shakes", "touches", "wakes", "warms", "washes", "draws", "sells", "buys", "brings",
)  # fmt: skip

ADJECTIVES: tuple[str, ...] = (
    "old", "young", "small", "large", "quiet", "loud", "bright", "dark", "warm", "cold",
    "heavy", "light", "soft", "hard", "quick", "slow", "happy", "sad", "tall", "short",
    "round", "flat", "clean", "dirty", "gentle", "brave", "tired", "busy", "empty", "full",
    "rich", "poor", "strange", "simple", "wooden", "golden", "silver", "narrow", "wide", "proud",
)  # fmt: skip

ADVERBS: tuple[str, ...] = (
    "quickly", "slowly", "quietly", "often", "rarely", "gladly", "carefully", "softly", "early", "late",
    "again", "nearly", "always", "never", "calmly", "today", "twice", "gently", "boldly", "happily",
)  # fmt: skip

PREPOSITIONS: tuple[str, ...] = (
    "near", "behind", "under", "above", "beside", "across", "through", "inside", "around", "past",
    "toward", "beyond",
)  # fmt: skip

#: Words of the task instructions and questions (see ``synthetic.context.INSTRUCTIONS``) and of the count sentence ("there is a red cup").
PROMPT_WORDS: tuple[str, ...] = (
    "instruction", "question", "single", "secret", "key", "keys", "is", "are", "hidden", "somewhere", "in", "long",
    "text", "find", "it", "and", "report", "its", "value", "values", "many", "of", "one", "asked", "several",
    "times", "with", "different", "every", "order", "variables", "assigned", "along", "follow", "chain", "list",
    "hold", "only", "last", "paragraph", "matters", "read", "gives", "give", "shows", "repeating", "continue",
    "next", "items", "mentions", "colors", "color", "count", "how", "often", "appears", "appear", "what", "among",
    "all", "which", "does", "for", "does", "there", "word", "to", "the", "a", "item",
)  # fmt: skip


def filler_words() -> tuple[str, ...]:
    """All words the filler grammar can emit, deduplicated, in a fixed order.

    Returns:
        The filler word types (determiners, topic nouns, shared nouns, verbs, adjectives, adverbs, prepositions).
    """
    topic_nouns = [noun for nouns in TOPIC_NOUNS.values() for noun in nouns]
    groups = (DETERMINERS, topic_nouns, SHARED_NOUNS, VERBS, ADJECTIVES, ADVERBS, PREPOSITIONS)
    return _unique(word for group in groups for word in group)


def vocabulary() -> tuple[str, ...]:
    """Every token of the suite in id order: special tokens first, then all words, each once.

    Returns:
        The token strings; the token at index ``i`` has id ``i`` in :func:`build_tokenizer`'s tokenizer.
    """
    groups = (
        SPECIAL_TOKENS,
        PUNCTUATION,
        MARKER_WORDS,
        KEY_TOKENS,
        VALUE_TOKENS,
        VARIABLE_TOKENS,
        NUMBER_TOKENS,
        COLOR_WORDS,
        filler_words(),
        PROMPT_WORDS,
    )
    return _unique(word for group in groups for word in group)


def _unique(words: Any) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for word in words:
        seen.setdefault(word, None)
    return tuple(seen)
