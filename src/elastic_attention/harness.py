"""lm-evaluation-harness glue: a model type ``elastic-attention`` (lm-eval's Hugging Face model with routers attached).

    elastic-attention lm-eval --model elastic-attention --model_args pretrained=DIR,router=ADAPTER \\
        --tasks elastic_suite_tiny --include_path "$(python -c 'import elastic_attention.harness as h; print(h.TASKS)')"

``elastic-attention lm-eval ARGS`` imports this module (which registers the model type) and runs lm-eval's command
line with ARGS; in Python, import it and call ``lm_eval.simple_evaluate(model="elastic-attention", ...)``. The model
is loaded by `elastic_attention.from_pretrained` (the authors' layout, or a plain folder with ``router=`` or an
adapter inside), so every lm-eval request runs through elastic attention; the routing of every generation batch
(MSR and ESR per sample) is logged at INFO and kept in ``routing_log``. Loglikelihood requests route on the whole
scored sequence (context and continuation), since lm-eval scores them in one forward.

`TASKS` is a folder of lm-eval tasks over this project's synthetic suite (a task YAML and its JSONL rows) for the
shipped tiny backbone; `export_suite_jsonl` writes such rows for other tasks and lengths.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from elastic_attention.assets import LM_EVAL_TASKS
from elastic_attention.errors import InputError
from elastic_attention.integration import routing_report
from elastic_attention.rows import encode_row

logger = logging.getLogger(__name__)

TASKS = LM_EVAL_TASKS

try:
    from lm_eval.api.registry import register_model
    from lm_eval.models.huggingface import HFLM
except ImportError as error:  # the extra is missing: say how to get it, where the module is imported
    raise InputError("the lm-evaluation-harness glue needs lm-eval: pip install 'elastic-attention[lm-eval]'") from error


@register_model("elastic-attention")
class ElasticAttentionLM(HFLM):
    """lm-eval's HFLM over a model with elastic attention attached.

    Args:
        pretrained: a model folder (the authors' layout, or a plain folder with an adapter inside or ``router``).
        router: an adapter folder for a plain model folder.
        backend: the attention backend (``auto``, ``fa4``, ``flex``, ``cpu``, ``reference``).
        dtype: ``float32`` or ``bfloat16`` (default: bfloat16 on CUDA, float32 on CPU).
        device: ``cpu`` or ``cuda`` (default: cuda when available).
        **kwargs: lm-eval's HFLM options (``batch_size``, ``max_length``, ...).
    """

    def __init__(self, pretrained: str, router: str | None = None, backend: str = "auto", dtype: str | None = None,
                 device: str | None = None, **kwargs) -> None:
        import torch
        from transformers import AutoTokenizer

        from elastic_attention.pretrained import from_pretrained

        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or ("bfloat16" if device.startswith("cuda") else "float32")
        if dtype not in ("float32", "bfloat16"):
            raise InputError(f"`dtype` must be float32 or bfloat16, got {dtype!r}")
        model = from_pretrained(pretrained, router=router, backend=backend, dtype=getattr(torch, dtype)).to(device)
        tokenizer = AutoTokenizer.from_pretrained(pretrained)
        super().__init__(pretrained=model.eval(), tokenizer=tokenizer, device=device, **kwargs)
        #: One entry per generation batch: {"msr": [...], "esr_last": [...], "esr_mean": [...]}.
        self.routing_log: list[dict[str, list[float]]] = []

    def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
        tokens = super()._model_generate(context, max_length, stop, **generation_kwargs)
        report = routing_report(self.model)
        entry = {"msr": report.msr.tolist(), "esr_last": report.esr_last.tolist(),
                 "esr_mean": report.esr_mean.tolist()}
        self.routing_log.append(entry)
        logger.info("elastic attention routing of %d prompts: MSR %s", len(entry["msr"]),
                    " ".join(f"{value:.2f}" for value in entry["msr"]))
        return tokens


def export_suite_jsonl(tokenizer, task: str, length: int, samples: int, path: str | Path, seed: int = 0) -> Path:
    """Rows of a suite task as lm-eval JSONL: ``prompt`` (the rendered chat prompt, ready to generate from),
    ``answer``, ``task``, ``kind``, ``length``."""
    from elastic_attention.evaluation.suites import suite_of

    suite = suite_of(task)
    lines = []
    for row in suite.generate(task, length, seed, samples, tokenizer):
        prompt_ids = encode_row(tokenizer, row).prompt_ids
        lines.append(json.dumps({"prompt": tokenizer.decode(prompt_ids), "answer": row.answer, "task": task,
                                 "kind": suite.kind(task), "length": length}))
    path = Path(path)
    path.write_text("\n".join(lines) + "\n")
    return path
