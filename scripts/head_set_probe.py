"""Which sets of full-attention heads a task needs: accuracy of every set of k KV heads on full attention (the rest on
sparse attention), for each k asked, on the evaluation's rows (same seed and samples as `elastic-attention eval`).

  python scripts/head_set_probe.py --model src/elastic_attention/assets/backbone_tiny --config configs/tiny_finding.yaml \
      --task needle_multivalue --length 1024 --samples 12 --heads 2,3,4 --out probe.json

Prints, per k, the best sets and how many sets reach each accuracy; writes every set's accuracy to --out.
"""

from __future__ import annotations

import argparse
import itertools
import json
from collections import Counter

import torch

from elastic_attention import ElasticConfig, attach
from elastic_attention.bench.timing import run_header
from elastic_attention.evaluation.pipeline import load_backbone
from elastic_attention.evaluation.runner import run_evaluation
from elastic_attention.integration import runtime_of
from elastic_attention.training.train_config import TrainConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--config", required=True, help="a training config: its `elastic` settings are used")
    parser.add_argument("--task", required=True)
    parser.add_argument("--length", type=int, required=True)
    parser.add_argument("--samples", type=int, default=12)
    parser.add_argument("--heads", type=lambda t: [int(x) for x in t.split(",")], default=[2, 3])
    parser.add_argument("--batch-size", type=int, default=12)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    model, tokenizer = load_backbone(args.model)
    attach(model, ElasticConfig(**TrainConfig.from_yaml(args.config).elastic))
    runtime = runtime_of(model)
    shape = (len(runtime.routed_layers), runtime.num_kv_heads)
    heads = list(itertools.product(range(shape[0]), range(shape[1])))

    def accuracy(full_heads) -> float:
        routing = torch.zeros(shape, dtype=torch.bool)
        for layer, head in full_heads:
            routing[layer, head] = True
        mode = "static" if full_heads else "sparse"
        (cell,) = run_evaluation(model, tokenizer, modes=[mode], tasks=[args.task], lengths=[args.length],
                                 samples=args.samples, static_routing=routing, batch_size=args.batch_size)
        return cell.accuracy

    full = run_evaluation(model, tokenizer, modes=["full"], tasks=[args.task], lengths=[args.length],
                          samples=args.samples, batch_size=args.batch_size)[0].accuracy
    print(f"full attention: {full:.3f}", flush=True)
    sets = {}
    for k in args.heads:
        scored = sorted(((accuracy(chosen), chosen) for chosen in itertools.combinations(heads, k)), reverse=True)
        sets[k] = [{"heads": [list(h) for h in chosen], "accuracy": value} for value, chosen in scored]
        counts = Counter(round(value, 3) for value, _ in scored)
        print(f"{k} heads: best {scored[0][0]:.3f} with {scored[0][1]}; sets per accuracy {dict(sorted(counts.items()))}",
              flush=True)
    with open(args.out, "w") as handle:
        json.dump({**run_header(torch.device("cpu")), "task": args.task, "length": args.length,
                   "samples": args.samples, "full_accuracy": full, "sets": sets}, handle, indent=1)


if __name__ == "__main__":
    main()
