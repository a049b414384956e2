"""The task suites behind one small interface: how rows are generated, decoded and scored (every row is encoded
the same way, by `elastic_attention.rows.encode_row`).

- ``synthetic``: the word-level suite of :mod:`elastic_attention.evaluation.synthetic`, for the backbones trained here
  on its tokenizer (exact lengths, exact-match scoring).
- ``code``: the real-text suite of :mod:`elastic_attention.evaluation.code_suite`, for real pretrained models
  (Python standard-library source, the model's own tokenizer and chat template).
- ``broad``: the training suite of :mod:`elastic_attention.evaluation.broad_suite`: seventeen families over four kinds
  of haystack, many wordings and layouts, for routers that must meet unseen prompts (its kinds are expectations).
- ``ruler``: RULER's offline tasks, made and scored by lm-evaluation-harness's rules
  (:mod:`elastic_attention.evaluation.ruler`): a held-out test, never a training source.

Task names are unique across suites, so a task name finds its suite (:func:`suite_of`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from elastic_attention.errors import InputError
from elastic_attention.evaluation import broad_suite, code_suite, ruler, synthetic
from elastic_attention.evaluation.scoring import Score
from elastic_attention.rows import Row
from elastic_attention.evaluation.synthetic.tokenizer import decode_answer


@dataclass(frozen=True)
class Suite:
    """One task suite.

    Attributes:
        name: ``synthetic``, ``code``, ``broad`` or ``ruler``.
        sensitive: its sparsity-sensitive tasks.
        robust: its sparsity-robust tasks.
        generate: ``(task, length, seed, n, tokenizer) -> rows``.
        decode: ``(tokenizer, generated ids) -> prediction text``.
        score: ``(prediction, row) -> Score``.
        ranking_tasks: the tasks whose rows rank heads by retrieval score (single-evidence needles).
    """

    name: str
    sensitive: tuple[str, ...]
    robust: tuple[str, ...]
    generate: Callable[..., list[Row]]
    decode: Callable[..., str]
    score: Callable[[str, Row], Score]
    ranking_tasks: tuple[str, ...]

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.sensitive + self.robust

    def kind(self, task: str) -> str:
        """``"sensitive"`` or ``"robust"``."""
        if task in self.sensitive:
            return "sensitive"
        if task in self.robust:
            return "robust"
        raise InputError(f"task {task!r} is not in the {self.name} suite; its tasks: {list(self.tasks)}")

    def resolve(self, names: Sequence[str]) -> list[str]:
        """Task names with the groups ``all``, ``sensitive`` and ``robust`` expanded, in order, without repeats.

        Raises:
            InputError: a name that is neither a task of this suite nor a group.
        """
        groups = {"all": self.tasks, "sensitive": self.sensitive, "robust": self.robust}
        resolved = [task for name in names for task in groups.get(name, (name,))]
        unknown = sorted(set(resolved) - set(self.tasks))
        if unknown:
            raise InputError(
                f"unknown {self.name} suite tasks {unknown}; known: {list(self.tasks)} or all / sensitive / robust"
            )
        if not resolved:
            raise InputError("no tasks given; name tasks, or all / sensitive / robust")
        return list(dict.fromkeys(resolved))


def _synthetic_generate(task: str, length: int, seed: int, n: int, tokenizer=None, **options) -> list[Row]:
    return synthetic.generate(task, length, seed, n, **options)


def _synthetic_score(prediction: str, row: Row) -> Score:
    exact = synthetic.score(prediction, row)
    return Score(float(exact), exact)


SUITES: dict[str, Suite] = {
    "synthetic": Suite(
        name="synthetic",
        sensitive=synthetic.SENSITIVE_TASKS,
        robust=synthetic.ROBUST_TASKS,
        generate=_synthetic_generate,
        decode=decode_answer,
        score=_synthetic_score,
        ranking_tasks=tuple(task for task in synthetic.SENSITIVE_TASKS if task.startswith("needle")),
    ),
    "code": Suite(
        name="code",
        sensitive=code_suite.SENSITIVE_TASKS,
        robust=code_suite.ROBUST_TASKS,
        generate=code_suite.generate,
        decode=code_suite.decode,
        score=code_suite.score,
        ranking_tasks=("passkey", "multikey"),
    ),
    "broad": Suite(
        name="broad",
        sensitive=broad_suite.SENSITIVE_TASKS,
        robust=broad_suite.ROBUST_TASKS,
        generate=broad_suite.generate,
        decode=broad_suite.decode,
        score=broad_suite.score,
        ranking_tasks=("fact_single", "fact_multikey"),
    ),
    "ruler": Suite(
        name="ruler",
        sensitive=tuple(ruler.RULER_TASKS),
        robust=(),
        generate=ruler.generate,
        decode=code_suite.decode,
        score=ruler.score,
        ranking_tasks=(),  # held out: no head is ever chosen on RULER rows
    ),
}


def get_suite(name: str) -> Suite:
    """The suite called ``name``.

    Raises:
        InputError: an unknown suite name.
    """
    if name not in SUITES:
        raise InputError(f"unknown suite {name!r}; known: {sorted(SUITES)}")
    return SUITES[name]


def suite_of(task: str) -> Suite:
    """The suite that holds ``task``.

    Raises:
        InputError: a task of no suite.
    """
    for suite in SUITES.values():
        if task in suite.tasks:
            return suite
    known = {name: list(suite.tasks) for name, suite in SUITES.items()}
    raise InputError(f"unknown task {task!r}; known: {known}")
