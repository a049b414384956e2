"""Can a router at layer 0 learn the per-prompt teacher? What the head-set router reads there (the boundary-pooled
pre-RoPE keys of layer 0, computed on the CPU from the model file), fitted to the teacher's labels on the validation
rows, and what the fitted router predicts on the held-out rows (reported only).

    python studies/signal_router/layer0_probe.py --gguf ~/.cache/elastic-attention/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --tokenizer artifacts/qwen2.5-coder-1.5b-tokenizer --cells cells \
        --features results/features_validation_h100_2026-12-07.jsonl.gz --scores results/broad_validation_scores.json \
        --eval results/code_validation_eval_h100_2026-12-07.json --heldout-eval results/heldout_eval_h100_2026-12-07.json \
        --out results/layer0_probe.json

Layer 0's keys before RoPE depend on each token alone (embedding, input norm, key projection), so a prompt's pooled
keys (the mean over its first --pool-first and last --pool-last tokens, as `router.pooling.boundary_pool`) need no forward of the
model. The teacher's label of a validation row is the config's: layer --layer's signal, --statistic over the last
--queries queries, largest over KV heads, at or above --threshold (what `signal_teacher_layer` labels, read off the
validation features). A `HeadSetRouter` with the adapter's shape (two sets; standardized inputs) is fitted to those
labels by the teacher's cross-entropy, in --folds folds over the validation rows (each row predicted by the router
fitted without it), then once on them all. The floor threshold on its probability is the one that keeps --recall of
the teacher's positive rows on the floor (cross-fitted predictions). Reported: AUC for the teacher's label and for
need (full attention beats all-SSA by 0.5) on the validation rows; on the held-out rows (RULER and the code suite at
8K and 16K, never used for a choice) the AUC for need (a row of a retrieval task that full attention answers,
against the rows of the tasks all-SSA keeps) and, per task, the share of rows the threshold sends to all-SSA.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from input_auc import auc
from select_router import add_validation_arguments, validation_rows

#: Held-out tasks whose rows need the far context when full attention answers them, and those all-SSA keeps.
NEEDY = {"niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "passkey", "multikey", "multivalue",
         "find_definition"}
KEPT = {"ruler_cwe", "ruler_fwe", "next_line", "recent_fact", "pattern", "recent_definition"}
_RULER = {"niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe"}
#: Qwen2.5's head width (the key projection's rows are KV heads times this).
HEAD_DIM = 128
LENGTHS = (8192, 16384)
#: Token ids kept at each end of a prompt (the largest pool any run of this script reads).
BOUNDARY = 400


def layer0_key_weights(gguf: str) -> dict[str, torch.Tensor]:
    """The embedding, layer 0's input norm and key projection of the model file, float32."""
    from gguf import GGUFReader

    from elastic_attention.gguf_weights import dequantize, hugging_face_name

    wanted = {"model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
              "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.k_proj.bias"}
    weights = {}
    for tensor in GGUFReader(gguf).tensors:
        name = hugging_face_name(tensor.name)
        if name in wanted:
            data = torch.from_numpy(tensor.data.copy()).view(torch.uint8)
            shape = tuple(int(size) for size in reversed(tensor.shape.tolist()))
            weights[name] = dequantize(data, tensor.tensor_type.name, shape).float()
    return weights


def pooled_keys(ids: list[int], weights: dict, first: int, last: int, kv_heads: int, eps: float) -> torch.Tensor:
    """[Hkv, D] float32: layer 0's pre-RoPE keys of ``ids`` pooled by `boundary_pool` over the first ``first`` and
    last ``last`` tokens."""
    from elastic_attention.patterns import SequenceLayout
    from elastic_attention.router.pooling import boundary_pool

    hidden = weights["model.embed_tokens.weight"][torch.tensor(ids)]
    hidden = hidden * torch.rsqrt(hidden.square().mean(-1, keepdim=True) + eps)
    hidden = hidden * weights["model.layers.0.input_layernorm.weight"]
    projection = "model.layers.0.self_attn.k_proj"
    keys = hidden @ weights[f"{projection}.weight"].T + weights[f"{projection}.bias"]
    return boundary_pool(keys.view(1, len(ids), kv_heads, -1), SequenceLayout.dense(1, len(ids)), first, last)[0]


def fit(inputs: torch.Tensor, labels: torch.Tensor, steps: int, seed: int, weight_decay: float = 0.0):
    """A two-set `HeadSetRouter` fitted by cross-entropy to ``labels`` ([N] bool: the floor set) from ``inputs``
    ([N, Hkv, D]); returns it (eval mode)."""
    from elastic_attention.router.head_set_router import HeadSetRouter

    torch.manual_seed(seed)
    router = HeadSetRouter(inputs.shape[2], 4, inputs.shape[1], choices=2, routed_layers=1, standardize=True)
    router.set_feature_statistics(inputs)
    optimizer = torch.optim.AdamW(router.parameters(), lr=1e-3, weight_decay=weight_decay)
    target = labels.long()  # set 1: the floor, set 0: all-SSA
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(router.choice_logits(inputs), target).backward()
        optimizer.step()
    return router.eval()


def floor_probability(router, inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.softmax(router.choice_logits(inputs), dim=-1)[:, 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--cells", required=True, help="folder with broad/ and code_val/ (seed 777), ruler/ and code/ "
                                                       "(seed 0)")
    add_validation_arguments(parser, scores_required=True)
    parser.add_argument("--heldout-eval", required=True,
                        help="eval.json with full attention's rows of the held-out cells")
    parser.add_argument("--layer", type=int, default=21)
    parser.add_argument("--statistic", default="max")
    parser.add_argument("--queries", type=int, default=16)
    parser.add_argument("--threshold", type=float, default=0.584)
    parser.add_argument("--pool-first", type=int, default=100, help="leading tokens pooled (the config's pool_first)")
    parser.add_argument("--pool-last", type=int, default=100, help="trailing tokens pooled (the config's pool_last)")
    parser.add_argument("--ids-cache", help="JSON of the rows' boundary token ids: written once, read after")
    parser.add_argument("--recall", type=float, default=0.98)
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--validation-only", action="store_true", help="no held-out row is read (for choosing)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if max(args.pool_first, args.pool_last) > BOUNDARY:
        parser.error(f"--pool-first and --pool-last read at most the {BOUNDARY} tokens kept at each end")
    from transformers import AutoTokenizer

    from elastic_attention.evaluation.row_cells import read_cells
    from elastic_attention.rows import encode_row

    started = time.time()
    weights = layer0_key_weights(args.gguf)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    kv_heads = weights["model.layers.0.self_attn.k_proj.weight"].shape[0] // HEAD_DIM

    def boundary_ids(folder: str, seed: int, samples: int) -> dict:
        """(task, length, index) -> the prompt's first and last `BOUNDARY` token ids (all of a shorter prompt)."""
        found = {}
        cells = read_cells(Path(args.cells) / folder, seed=seed, samples=samples, tokenizer=tokenizer)
        for task, length, rows in cells:
            if length in LENGTHS:
                for index, row in enumerate(rows):
                    ids = encode_row(tokenizer, row).prompt_ids
                    found[(task, length, index)] = ids if len(ids) <= 2 * BOUNDARY else ids[:BOUNDARY] + ids[-BOUNDARY:]
        return found

    if args.ids_cache and Path(args.ids_cache).exists():
        cached = json.loads(Path(args.ids_cache).read_text())
        validation_ids, heldout_ids = ({tuple(json.loads(key)): ids for key, ids in part.items()} for part in cached)
    else:
        validation_ids = {**boundary_ids("broad", 777, 12), **boundary_ids("code_val", 777, 12)}
        heldout_ids = {**boundary_ids("ruler", 0, 50), **boundary_ids("code", 0, 50)}
        if args.ids_cache:
            Path(args.ids_cache).write_text(json.dumps([{json.dumps(list(key)): ids for key, ids in part.items()}
                                                        for part in (validation_ids, heldout_ids)]))
    if args.validation_only:
        heldout_ids = {}
    validation_keys = {key: pooled_keys(ids, weights, args.pool_first, args.pool_last, kv_heads, 1e-6)
                       for key, ids in validation_ids.items()}
    heldout_keys = {key: pooled_keys(ids, weights, args.pool_first, args.pool_last, kv_heads, 1e-6)
                    for key, ids in heldout_ids.items()}
    print(f"pooled keys of {len(validation_keys)} validation and {len(heldout_keys)} held-out rows, "
          f"{time.time() - started:.0f} s", flush=True)

    records, need, signal = validation_rows(args)
    first = records[0]
    statistic, count = first["statistics"].index(args.statistic), first["queries"].index(args.queries)
    teacher = signal[:, statistic, count, args.layer].amax(dim=-1) >= args.threshold
    inputs = torch.stack([validation_keys[(r["task"], r["length"], r["index"])] for r in records])

    order = torch.randperm(len(records), generator=torch.Generator().manual_seed(0))
    crossed = torch.empty(len(records))
    for fold in range(args.folds):
        held = order[fold::args.folds]
        kept = torch.ones(len(records), dtype=torch.bool)
        kept[held] = False
        router = fit(inputs[kept], teacher[kept], args.steps, fold, args.weight_decay)
        crossed[held] = floor_probability(router, inputs[held])
    positives = crossed[teacher].sort().values
    threshold = float(positives[int((1 - args.recall) * len(positives))])
    sparse = crossed < threshold
    validation = {
        "rows": len(records), "teacher_positive": int(teacher.sum()), "needy": int(need.sum()),
        "teacher_auc_of_need": auc(signal[:, statistic, count, args.layer].amax(dim=-1).tolist(), need.tolist()),
        "cross_fitted_auc": {"teacher_label": auc(crossed.tolist(), teacher.tolist()),
                             "need": auc(crossed.tolist(), need.tolist())},
        "floor_threshold": threshold, "sent_sparse": int(sparse.sum()), "needy_sent_sparse": int((sparse & need).sum()),
        "teacher_positive_sent_sparse": int((sparse & teacher).sum()),
        "sparse_share_by_task": _shares([(r["task"], r["length"]) for r in records], sparse),
    }
    if args.validation_only:
        Path(args.out).write_text(json.dumps({"args": vars(args), "validation": validation}, indent=1))
        print(json.dumps({k: v for k, v in validation.items() if k != "sparse_share_by_task"}))
        return
    router = fit(inputs, teacher, args.steps, args.folds, args.weight_decay)
    full = {(cell["task"], cell["length"]): cell["row_accuracy"]
            for cell in json.loads(Path(args.heldout_eval).read_text())["results"] if cell["mode"] == "full"}
    keys, labels = [], []
    for task, length, index in sorted(heldout_keys):
        answered = (task, length) in full and index < len(full[(task, length)]) and full[(task, length)][index] >= 0.5
        if task in KEPT or (task in NEEDY and answered):
            keys.append((task, length, index))
            labels.append(task in NEEDY)
    probability = floor_probability(router, torch.stack([heldout_keys[key] for key in keys]))
    labels = torch.tensor(labels)
    heldout = {"rows": len(keys), "needy": int(labels.sum()),
               "auc_of_need": {suite: auc(probability[mask].tolist(), labels[mask].tolist()) for suite, mask in
                               (("ruler", torch.tensor([k[0] in _RULER for k in keys])),
                                ("code", torch.tensor([k[0] not in _RULER for k in keys])))},
               "sparse_share_by_task": _shares([(k[0], k[1]) for k in keys], probability < threshold)}
    result = {"question": __doc__.split("\n\n")[0].replace("\n", " "), "args": vars(args), "validation": validation,
              "heldout_reported_only": heldout, "seconds": round(time.time() - started)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in validation.items() if k != "sparse_share_by_task"}, indent=1))
    print(json.dumps(heldout, indent=1))


def _shares(cells: list[tuple[str, int]], sparse: torch.Tensor) -> dict:
    """task@length -> share of its rows in ``sparse``."""
    counts: dict = defaultdict(lambda: [0, 0])
    for (task, length), value in zip(cells, sparse.tolist()):
        counts[f"{task}@{length}"][0] += int(value)
        counts[f"{task}@{length}"][1] += 1
    return {cell: sent / total for cell, (sent, total) in sorted(counts.items())}


if __name__ == "__main__":
    main()
