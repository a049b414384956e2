"""The broad suite: long-context training tasks with breadth, so that a router trained on them meets prompts it never
saw (RULER through lm-evaluation-harness, the code suite's evaluation rows, wordings of users).

Seventeen families (:data:`FAMILIES`; ``docs/guide-train.md`` lists them): retrieval of one, several or all values of
seven value types; key-value lookup in JSON, tables and logs; two-hop facts and chains of copies; where a function is
defined and who calls it; counting and aggregation over the whole context; a recent fact, the last record, the next
item of a sequence, the rest of a line, a few-shot rule near the end.

Breadth of every row:

- haystacks of four kinds: Python source (the shipped standard-library snapshot), prose (that snapshot's
  docstrings), records (generated CSV, markdown, JSON Lines, JSON arrays, server logs) and word noise (random words
  of a vocabulary built from the docstrings);
- needles in the haystack's own formats (a sentence, a comment, a ``key: value`` line, a JSON object, an assignment,
  a log line, a table row, a bullet);
- per family at least eight instructions and eight questions (:mod:`.wordings`), most questions ending with one of
  several answer-format hints;
- the instruction before the context (instruction, context, question) or after it (context, instruction,
  question), and a system turn in about half the rows.

Length contract: ``generate(task, length, seed, n, tokenizer)`` returns rows whose prompt, rendered with the
tokenizer's chat template (system turn included) and generation prompt, has between
``length - LENGTH_TOLERANCE_TOKENS`` and ``length`` tokens (``metadata["prompt_tokens"]`` is the exact count); lengths
from `MIN_LENGTH` (4096) up; 4K-32K is the intended range.

Epoch contract: row ``i`` of ``generate(task, length, seed, n, tokenizer)`` is a pure function of ``(task, length,
seed, i)`` and the tokenizer (drawn from ``SampleRandom(sample_seed(task, length, seed, i))``; the tokenizer only
decides where contexts are cut). The same arguments give the same rows in any process; another ``seed`` gives other
text, other needles and other wordings. A trainer wanting new text each epoch asks for epoch ``e``'s rows with a seed
of its own (e.g. ``base_seed + e``); keep training seeds apart from the seeds of validation rows.

Kinds are expectations: ``sensitive`` families put their evidence at least `FAR_TOKENS` (2500) context tokens before
the question, outside a 2048-token streaming window; ``robust`` ones put it within the last ~700 tokens or are local.
The kinds and sparsity targets used in training come from measuring, per family, full attention against sparse
attention on the generator's own validation rows; :func:`expected_targets` is only the starting point.

Metadata of every row: ``length``, ``prompt_tokens``, ``context_tokens``, ``seed`` (the seed the row was drawn from),
``kind``, ``haystack`` and ``haystack_format``, ``instruction_wording`` and ``question_wording`` (indices into
:mod:`.wordings`), ``layout``, ``answer_kind``, ``evidence_spans`` (character spans of the evidence in
``row.prompt``), ``depths`` (token depth of each evidence needle in the context), ``distractors``,
``max_new_tokens``, and family-specific fields.
"""

from elastic_attention.evaluation.broad_suite.assembly import (
    FAR_TOKENS,
    LAYOUTS,
    LENGTH_TOLERANCE_TOKENS,
    RECENT_TOKENS,
)
from elastic_attention.evaluation.broad_suite.tasks import (
    EXPECTED_TARGETS,
    FAMILIES,
    MIN_LENGTH,
    ROBUST_TASKS,
    SENSITIVE_TASKS,
    Family,
    decode,
    expected_targets,
    generate,
    make_row,
    plan_row,
    score,
)

__all__ = [
    "EXPECTED_TARGETS",
    "FAMILIES",
    "FAR_TOKENS",
    "LAYOUTS",
    "LENGTH_TOLERANCE_TOKENS",
    "MIN_LENGTH",
    "RECENT_TOKENS",
    "ROBUST_TASKS",
    "SENSITIVE_TASKS",
    "Family",
    "decode",
    "expected_targets",
    "generate",
    "make_row",
    "plan_row",
    "score",
]
