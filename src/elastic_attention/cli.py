"""Command line: `elastic-attention <command>`. Parses arguments and calls the public API; no logic of its own."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="elastic-attention", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True)

    demo = commands.add_parser("demo", help="train routers on the shipped tiny backbone and compare routings (CPU)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="demo_out", help="folder for the plots and numbers")
    demo.add_argument("--samples", type=int, default=12, help="evaluation rows per (task, length)")

    evaluate = commands.add_parser("eval", help="evaluate a model on a task suite (synthetic or code)")
    evaluate.add_argument("--model", required=True, help="folder of a Hugging Face causal LM and its tokenizer")
    evaluate.add_argument("--router", help="router adapter folder (needed for the elastic mode)")
    evaluate.add_argument("--modes", default="full,sparse",
                          help="comma list of full, elastic, static, static@MSR (e.g. static@0.7), sparse")
    evaluate.add_argument("--suite", default="synthetic", choices=["synthetic", "code"],
                          help="synthetic (word-level, for the backbones trained here) or code (real Python source)")
    evaluate.add_argument("--tasks", default="all", help="comma list of task names, or all / sensitive / robust")
    evaluate.add_argument("--lengths", default="2k,4k", help="comma list of prompt lengths, e.g. 2k,4k,8k or 3000")
    evaluate.add_argument("--samples", type=int, default=20, help="rows per (task, length)")
    evaluate.add_argument("--static-msr", type=float, help="MSR of the static hybrid (default: elastic's average)")
    evaluate.add_argument("--out", default="eval_out", help="folder for eval.json and accuracy_vs_msr.png")
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--batch-size", type=int, default=8)
    evaluate.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    evaluate.add_argument("--dtype", choices=["float32", "bfloat16"],
                          help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")

    show = commands.add_parser("try", help="answer a few suite rows with a model and its routers; print the routing")
    show.add_argument("--model", required=True, help="folder of a Hugging Face causal LM and its tokenizer")
    show.add_argument("--router", required=True, help="router adapter folder")
    show.add_argument("--suite", default="code", choices=["synthetic", "code"])
    show.add_argument("--tasks", default="passkey,next_line", help="comma list of task names, or all / sensitive / robust")
    show.add_argument("--length", default="4k", help="prompt length, e.g. 4k or 3000")
    show.add_argument("--samples", type=int, default=1, help="rows per task")
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    show.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")

    models = commands.add_parser("models", help="pretrained models fetched as an install step: list | fetch NAME")
    models.add_argument("action", choices=["list", "fetch"])
    models.add_argument("name", nargs="?", help="the model to fetch (see `models list`)")
    models.add_argument("--out", help="folder to write the Hugging Face model to (default: artifacts/NAME)")
    models.add_argument("--gguf", help="an already assembled GGUF file to convert instead of downloading")
    models.add_argument("--cache", help="where the assembled GGUF file is kept (default: ~/.cache/elastic-attention)")

    trainer = commands.add_parser("train", help="train routers: elastic-attention train CONFIG.yaml [key=value ...]")
    trainer.add_argument("config", help="YAML training config (see configs/)")
    trainer.add_argument("overrides", nargs="*", help="key=value or section.key=value, parsed as YAML")
    trainer.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
    trainer.add_argument("--no-progress", action="store_true", help="no progress bar")

    bench = commands.add_parser("bench", help="GPU benchmarks: bench layer|prefill|decode|train-step [options]")
    bench.add_argument("benchmark", choices=["layer", "prefill", "decode", "train-step"])
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options of the benchmark")

    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    for module in ("yaml", "matplotlib") if args.command in ("train", "eval", "demo") else ():
        if importlib.util.find_spec(module) is None:
            raise SystemExit(f"`elastic-attention {args.command}` needs {module}: pip install 'elastic-attention[train]'")
    if args.command == "bench":
        module = args.benchmark.replace("-", "_")
        importlib.import_module(f"elastic_attention.bench.{module}").main(args.options)
    elif args.command == "demo":
        from elastic_attention.demo import run_demo

        print(run_demo(args.out, seed=args.seed, samples=args.samples))
    elif args.command == "train":
        import json

        from elastic_attention.training import TrainConfig, train

        summary = train(TrainConfig.from_yaml(args.config, args.overrides), resume=args.resume,
                        progress=not args.no_progress)
        print(json.dumps({key: summary[key] for key in ("steps", "seconds", "adapter") if key in summary}, indent=2))
    elif args.command == "eval":
        from elastic_attention.evaluation.pipeline import resolve_tasks, run_eval_command

        print(
            run_eval_command(
                args.model, router=args.router, modes=_split(args.modes),
                tasks=resolve_tasks(_split(args.tasks), args.suite),
                lengths=[parse_length(text) for text in _split(args.lengths)], samples=args.samples, out=args.out,
                static_msr=args.static_msr, seed=args.seed, batch_size=args.batch_size, device=args.device,
                dtype=args.dtype,
            )
        )
    elif args.command == "try":
        from elastic_attention.evaluation.pipeline import resolve_tasks
        from elastic_attention.evaluation.showcase import run_try_command

        print(
            run_try_command(
                args.model, router=args.router, tasks=resolve_tasks(_split(args.tasks), args.suite),
                length=parse_length(args.length), samples=args.samples, seed=args.seed, device=args.device,
                dtype=args.dtype,
            )
        )
    elif args.command == "models":
        from elastic_attention.models import KNOWN_MODELS, fetch_model

        if args.action == "list":
            print("\n".join(f"{name}: {source.description}" for name, source in KNOWN_MODELS.items()))
        elif args.name is None:
            raise SystemExit(f"`models fetch` needs a model name; known: {', '.join(KNOWN_MODELS)}")
        else:
            out = fetch_model(args.name, args.out or f"artifacts/{args.name}", cache_dir=args.cache, gguf_file=args.gguf)
            print(f"{args.name} is ready at {out}")
    return 0


_TOKEN_SUFFIXES = {"k": 1 << 10, "m": 1 << 20}


def parse_length(text: str) -> int:
    """A token count: '4k' -> 4096, '1m' -> 1048576, '3000' -> 3000."""
    text = text.strip().lower()
    try:
        return int(text[:-1]) * _TOKEN_SUFFIXES[text[-1]] if text[-1:] in _TOKEN_SUFFIXES else int(text)
    except ValueError:
        raise SystemExit(f"cannot read length {text!r}: use a token count like 3000, 4k or 1m") from None


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


if __name__ == "__main__":
    sys.exit(main())
