"""Command line: `elastic-attention <command>`. Parses arguments and calls the public API; no logic of its own.

Every argument is checked before anything is loaded or written. A user error (a bad argument, configuration, file or
input: the package's own errors, a missing file) ends with exit status 2 and one line on stderr that names the
problem and the fix; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import sys
from pathlib import Path

from elastic_attention.assets import shipped_routers
from elastic_attention.errors import ElasticAttentionError, InputError
from elastic_attention.help_format import finish_parser
from elastic_attention.units import comma_list as _split
from elastic_attention.units import fraction, length_list, msr_list, non_negative_int, parse_length, positive_int


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["lm-eval"]:  # everything after it is lm_eval's (argparse would read its options as ours)
        return run_lm_eval(argv[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    overridable = args.command in ("train", "pretrain")
    if extra and overridable and all("=" in item and not item.startswith("-") for item in extra):
        args.overrides += extra  # key=value overrides after --resume or --no-progress
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(message)s")
    try:
        return run(args)
    except (ElasticAttentionError, FileNotFoundError) as error:
        if args.debug:
            raise
        message = str(error).strip().splitlines() or [type(error).__name__]
        print(f"elastic-attention {args.command}: error: {message[0]}", file=sys.stderr)
        for line in message[1:]:
            print(f"  {line}", file=sys.stderr)
        return 2


#: The routers shipped with the package, which --router takes by name.
ROUTER_NAMES = ", ".join(shipped_routers())
#: The task suites `eval`, `rows` and `try` take (`elastic_attention.evaluation.suites`).
EVAL_SUITES = ["synthetic", "code", "broad", "ruler"]
#: The suites `search-heads` draws its rows from (never a held-out test's) and their tasks as `evaluation.suites`
#: lists them, written out so that `--help` imports no torch (tests/test_head_set_search.py checks they agree).
SEARCH_TASKS = {
    "synthetic": ("needle_single", "needle_multikey", "needle_multivalue", "variable_tracking", "local_recall",
                  "local_pattern", "local_count"),
    "code": ("passkey", "multikey", "find_definition", "multivalue", "next_line", "recent_fact", "recent_definition",
             "pattern"),
}


#: Every suite's tasks (`--tasks` lists them in --help), written out as SEARCH_TASKS is (tests/test_cli_help.py).
SUITE_TASKS = {
    **SEARCH_TASKS,
    "broad": ("fact_single", "fact_multikey", "fact_multivalue", "two_hop", "chain_tracking", "json_lookup",
              "table_lookup", "log_lookup", "code_definition", "code_caller", "mention_count", "value_aggregate",
              "fact_recent", "last_record", "sequence_next", "line_completion", "rule_induction"),
    "ruler": ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe"),
}
#: One example command per subcommand, the end of its --help.
EXAMPLES = {
    "demo": "elastic-attention demo --out demo_out",
    "eval": "elastic-attention eval --model artifacts/qwen2.5-coder-0.5b-instruct --router qwen2.5-coder-0.5b-instruct "
            "\\\n    --suite code --modes full,elastic,sparse --tasks all --lengths 4k,8k --samples 20 --out eval_out",
    "try": "elastic-attention try --model artifacts/qwen2.5-coder-0.5b-instruct --router qwen2.5-coder-0.5b-instruct "
           "\\\n    --tasks passkey,recent_fact --length 4k",
    "generate": "elastic-attention generate --model artifacts/qwen2.5-coder-1.5b-instruct "
                "--router qwen2.5-coder-1.5b-instruct \\\n    --file prompt.txt --max-new-tokens 64 --compare",
    "rows": "elastic-attention rows --tokenizer artifacts/qwen2.5-coder-0.5b-instruct --suite ruler --tasks all "
            "\\\n    --lengths 8k,16k --samples 50 --out cells/ruler",
    "eval-merge": "elastic-attention eval-merge eval_8k eval_16k --out eval_all",
    "models": "elastic-attention models fetch qwen2.5-coder-0.5b-instruct --out artifacts/qwen2.5-coder-0.5b-instruct",
    "train": "elastic-attention train configs/tiny_suite.yaml steps=20 output_dir=runs/tiny",
    "pretrain": "elastic-attention pretrain configs/backbone_tiny.yaml max_steps=100",
    "bench": "elastic-attention bench prefill --help    (each benchmark's own options and example)",
}


def tasks_help(suites) -> str:
    """The --tasks help: a comma list of task names of the given suites, each suite's names spelled out."""
    names = "; ".join(f"{suite}: {', '.join(SUITE_TASKS[suite])}" for suite in suites)
    return f"comma list of task names of --suite, or all / sensitive / robust ({names})"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command (argument types validate their values).

    Each command is a pair of functions: ``_add_<command>(commands)`` adds its parser, ``_run_<command>(args)``
    carries it out; a new command adds both, its adder to the list below and its runner to `_RUNNERS`.
    """
    parser = argparse.ArgumentParser(prog="elastic-attention", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    from elastic_attention import __version__

    parser.add_argument("--version", action="version", version=f"elastic-attention {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True)
    for add_command in (_add_demo, _add_eval, _add_rows, _add_try, _add_generate, _add_lm_eval, _add_eval_merge,
                        _add_models, _add_recipes, _add_bench, _add_search_heads):
        add_command(commands)
    for name, command in commands.choices.items():
        if name != "lm-eval":  # lm_eval's own parser answers its --help (`run_lm_eval`)
            finish_parser(command, EXAMPLES.get(name, ""))
    return parser


def _add_demo(commands) -> None:
    """`demo`: train routers on the shipped tiny backbone and compare routings."""
    demo = commands.add_parser("demo", help="train routers on the shipped tiny backbone and compare routings (CPU)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", default="demo_out", help="folder for the plots and numbers")
    demo.add_argument("--samples", type=positive_int, default=12, help="evaluation rows per (task, length)")


def _add_eval(commands) -> None:
    """`eval`: evaluate a model on a task suite."""
    evaluate = commands.add_parser("eval", help="evaluate a model on a task suite (synthetic, code or ruler)")
    evaluate.add_argument("--model", required=True, help="folder of a Hugging Face causal LM and its tokenizer")
    evaluate.add_argument("--router", help=f"router adapter folder or shipped router name ({ROUTER_NAMES}; needed "
                                           "for the elastic mode)")
    evaluate.add_argument("--modes", type=mode_list, default="full,sparse",
                          help="comma list of full, elastic, static, static@MSR (e.g. static@0.7), sparse, heads "
                               "and heads@MSR (the fixed sets of --head-set)")
    evaluate.add_argument("--suite", default="synthetic", choices=EVAL_SUITES,
                          help="synthetic (word-level, for the backbones trained here), code (real Python source), "
                               "broad (the routers' long-context training families) or ruler (RULER's offline tasks "
                               "through lm-eval's generators; a held-out test)")
    evaluate.add_argument("--tasks", default="all", help=tasks_help(EVAL_SUITES))
    evaluate.add_argument("--lengths", type=length_list, default="2k,4k",
                          help="comma list of prompt lengths, e.g. 2k,4k,8k or 3000")
    evaluate.add_argument("--samples", type=positive_int, default=20, help="rows per (task, length)")
    evaluate.add_argument("--static-msr", type=fraction, help="MSR of the static hybrid (default: elastic's average)")
    evaluate.add_argument("--head-set",
                          help="head-set file for the heads mode (the --out of `elastic-attention search-heads`)")
    evaluate.add_argument("--head-set-msr", type=fraction,
                          help="MSR of the heads mode's set (a kept set, or a point of the file's search path); "
                               "default: elastic's average MSR when a path is known, else the file's only set")
    evaluate.add_argument("--config", help="a training config whose `elastic` settings attach the model when no "
                                           "--router is given (default: sink 64 + local 256 in blocks of 64, sized "
                                           "for the tiny backbones; a --router brings its adapter's window)")
    evaluate.add_argument("--out", default="eval_out", help="folder for eval.json, eval.md and accuracy_vs_msr.png")
    evaluate.add_argument("--overwrite", action="store_true",
                          help="replace the results of an evaluation with other settings in --out")
    evaluate.add_argument("--seed", type=int, default=0)
    evaluate.add_argument("--rows", help="folder of row cells written by `elastic-attention rows` (same tokenizer and "
                                         "seed): the cells found there are read instead of generated")
    evaluate.add_argument("--batch-size", type=positive_int, default=8)
    evaluate.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    evaluate.add_argument("--dtype", choices=["float32", "bfloat16"],
                          help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")


def _add_rows(commands) -> None:
    """`rows`: write suite rows as row cells, to evaluate elsewhere (`eval --rows`)."""
    rows = commands.add_parser(
        "rows", help="write suite rows (RULER's included) as row-cell files for `eval --rows`",
        description="Write the rows of each task and length as DIR/<task>_<length>.jsonl, measured with the model's "
                    "tokenizer, so that `elastic-attention eval --rows DIR` reads them instead of generating them "
                    "(on a machine without lm-eval, or where generating long rows would cost GPU time).",
)
    rows.add_argument("--tokenizer", required=True, help="folder holding the model's tokenizer (the model folder)")
    rows.add_argument("--suite", default="ruler", choices=EVAL_SUITES, help="the suite of the tasks")
    rows.add_argument("--tasks", default="all", help=tasks_help(EVAL_SUITES))
    rows.add_argument("--lengths", type=length_list, default="8k,16k", help="comma list of prompt lengths")
    rows.add_argument("--samples", type=positive_int, default=50, help="rows per (task, length)")
    rows.add_argument("--seed", type=int, default=0, help="the suites' seed (give eval the same --seed)")
    rows.add_argument("--out", required=True, help="folder of the cells (created; a cell's file is replaced)")


def _add_try(commands) -> None:
    """`try`: answer a few suite rows and print the routing."""
    show = commands.add_parser("try", help="answer a few suite rows with a model and its routers; print the routing")
    show.add_argument("--model", required=True, help="folder of a Hugging Face causal LM and its tokenizer")
    show.add_argument("--router", required=True, help=f"router adapter folder or shipped router name ({ROUTER_NAMES})")
    show.add_argument("--suite", default="code", choices=["synthetic", "code"])
    show.add_argument("--tasks", default="passkey,next_line", help=tasks_help(["synthetic", "code"]))
    show.add_argument("--length", type=parse_length, default="4k", help="prompt length, e.g. 4k or 3000")
    show.add_argument("--samples", type=positive_int, default=1, help="rows per task")
    show.add_argument("--seed", type=int, default=0)
    show.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    show.add_argument("--compare", action="store_true",
                      help="also generate 32 tokens of each prompt with the plain model and the routed one; print "
                           "prefill time, decode tokens/s and KV-cache bytes side by side")
    show.add_argument("--dtype", choices=["float32", "bfloat16"],
                      help="default: bfloat16 on CUDA and on CPUs with bf16 instructions, else float32")


def _add_generate(commands) -> None:
    """`generate`: continue a prompt of the user's own."""
    generate = commands.add_parser("generate", help="continue a prompt of your own; print the continuation and routing")
    generate.add_argument("--model", required=True, help="folder of a Hugging Face causal LM and its tokenizer")
    generate.add_argument("--router", help=f"router adapter folder or shipped router name ({ROUTER_NAMES}); without: "
                                           "the unmodified model")
    source = generate.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="the prompt text")
    source.add_argument("--file", help="a UTF-8 text file holding the prompt")
    generate.add_argument("--max-new-tokens", type=positive_int, default=64)
    generate.add_argument("--raw", action="store_true", help="no chat template: feed the text as it is")
    generate.add_argument("--compare", action="store_true",
                          help="also run the plain model on the prompt; print prefill time, decode tokens/s and "
                               "KV-cache bytes side by side")
    generate.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    generate.add_argument("--dtype", choices=["float32", "bfloat16"],
                          help="default: bfloat16 on CUDA and on CPUs with bf16 instructions, else float32")


def _add_lm_eval(commands) -> None:
    """`lm-eval`: lm-evaluation-harness's own command line (`run_lm_eval`; its arguments pass through)."""
    harness = commands.add_parser("lm-eval", add_help=False,
                                  help="run lm-evaluation-harness with the elastic-attention model type (needs the "
                                       "lm-eval extra; `elastic-attention lm-eval --help`)")
    harness.add_argument("arguments", nargs=argparse.REMAINDER, help="lm_eval's own arguments")


def _add_eval_merge(commands) -> None:
    """`eval-merge`: one table from several eval.json files."""
    merge = commands.add_parser("eval-merge", help="one table from the eval.json files of several eval calls")
    merge.add_argument("files", nargs="+", help="eval.json files, or the folders `eval --out` wrote them to")
    merge.add_argument("--out", required=True, help="folder for the merged eval.json, eval.md and accuracy_vs_msr.png")
    merge.add_argument("--modes", help="comma list: keep only these modes' cells (default: all), e.g. full,sparse")


def _add_models(commands) -> None:
    """`models list | fetch NAME`."""
    models = commands.add_parser("models", help="pretrained models fetched as an install step: list | fetch NAME")
    models.add_argument("action", choices=["list", "fetch"])
    from elastic_attention.models import KNOWN_MODELS

    models.add_argument("name", nargs="?", help=f"the model to fetch: {', '.join(KNOWN_MODELS)}")
    models.add_argument("--out", help="folder to write the Hugging Face model to (default: artifacts/NAME)")
    models.add_argument("--gguf", help="an already assembled GGUF file to convert instead of downloading")
    models.add_argument("--cache", help="where the assembled GGUF file is kept (default: ~/.cache/elastic-attention)")
    models.add_argument("--device", help="where to dequantize the weights: cpu (the default) or cuda (the same bytes)")


def _add_recipes(commands) -> None:
    """`train` and `pretrain`: a YAML recipe and its key=value overrides."""
    for name, summary, config_help in (
        ("train", "train routers", "YAML training config (see configs/)"),
        ("pretrain", "pretrain a backbone on the synthetic suite", "YAML pretraining config (configs/backbone_*.yaml)"),
    ):
        recipe = commands.add_parser(name, help=f"{summary}: elastic-attention {name} CONFIG.yaml [key=value ...]")
        recipe.add_argument("config", help=config_help)
        recipe.add_argument("overrides", nargs="*", help="key=value or section.key=value, parsed as YAML")
        recipe.add_argument("--resume", action="store_true", help="continue from the run's latest checkpoint")
        recipe.add_argument("--overwrite", action="store_true", help="replace a previous run in the output folder")
        recipe.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_bench(commands) -> None:
    """`bench NAME [options]`: each benchmark parses its own options."""
    benchmarks = ["layer", "prefill", "decode", "decode-graphs", "train-step", "cpu-prefill", "request"]
    bench = commands.add_parser("bench", help=f"benchmarks: bench {'|'.join(benchmarks)} [options]")
    bench.add_argument("benchmark", choices=benchmarks)
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options of the benchmark")


def _add_search_heads(commands) -> None:
    """`search-heads`: the greedy search for fixed head sets (`head_sets.search`)."""
    names = "; ".join(f"{suite}: {', '.join(tasks)}" for suite, tasks in SEARCH_TASKS.items())
    search = commands.add_parser(
        "search-heads", help="search greedily for fixed sets of full-attention KV heads that keep tasks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="From every KV head on full attention, each round moves to sparse attention the --step heads "
                    "whose move raises the\nanswer cross-entropy of the search rows least, up to the largest --msr. "
                    "Writes the path (every head in the order it\nwent sparse) and the sets at each --msr to --out, "
                    "after every round; `eval --modes heads@M --head-set FILE`\nevaluates any point of the path.",
        epilog="example:\n  elastic-attention search-heads --model artifacts/qwen2.5-coder-0.5b-instruct --suite code "
               "--tasks sensitive \\\n      --length 16k --msr 0.5,0.6,0.7 --search-samples 2 --samples 0 --out search.json")
    search.add_argument("--model", required=True, help="folder of a Hugging Face causal LM and its tokenizer")
    search.add_argument("--tasks", required=True,
                        help=f"comma list of task names of --suite, or all / sensitive / robust; several make one "
                             f"joint set ({names})")
    search.add_argument("--suite", default="code", choices=list(SEARCH_TASKS),
                        help="suite of the tasks (default: %(default)s)")
    search.add_argument("--length", type=parse_length, required=True, help="prompt length, e.g. 16k or 3000")
    search.add_argument("--msr", type=msr_list, default="0.5,0.6,0.7",
                        help="comma list of MSRs in (0, 1] at which to keep the set (default: %(default)s)")
    search.add_argument("--out", required=True, help="the head-set JSON file to write")
    search.add_argument("--config", help="a training config whose `elastic` settings run the sparse heads "
                                         "(default: sink 64 + local 256 in blocks of 64, as eval)")
    search.add_argument("--start", metavar="FILE@MSR",
                        help="prune from this point of an earlier search's path instead of from full attention")
    search.add_argument("--step", type=positive_int, default=4,
                        help="heads moved to sparse attention per round at most (default: %(default)s)")
    search.add_argument("--search-samples", type=positive_int, default=8,
                        help="search rows of each task (default: %(default)s)")
    search.add_argument("--search-seed", type=int, default=1,
                        help="seed of the search rows; the evaluation uses 0 (default: %(default)s)")
    search.add_argument("--pack-tokens", type=positive_int, default=65536,
                        help="token budget of one forward of search rows (default: %(default)s)")
    search.add_argument("--samples", type=non_negative_int, default=50,
                        help="evaluation rows of each task for each kept set, full attention and all-sparse; 0: no "
                             "evaluation (default: %(default)s)")
    search.add_argument("--batch-size", type=positive_int, default=16,
                        help="rows per generate call of the evaluation (default: %(default)s)")
    search.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    search.add_argument("--dtype", choices=["float32", "bfloat16"],
                        help="model dtype (default: bfloat16 on CUDA, float32 on CPU)")


def run(args: argparse.Namespace) -> int:
    """Carry out a parsed command."""
    for module in ("yaml", "matplotlib") if args.command in ("train", "pretrain", "eval", "eval-merge", "demo") else ():
        if importlib.util.find_spec(module) is None:
            raise InputError(f"`elastic-attention {args.command}` needs {module}: pip install 'elastic-attention[train]'")
    _check_outputs(args)
    return _RUNNERS[args.command](args) or 0


def _run_bench(args: argparse.Namespace) -> None:
    module = args.benchmark.replace("-", "_")
    importlib.import_module(f"elastic_attention.bench.{module}").main(args.options)


def _run_demo(args: argparse.Namespace) -> None:
    from elastic_attention.demo import run_demo

    print(run_demo(args.out, seed=args.seed, samples=args.samples))


def _run_train(args: argparse.Namespace) -> None:
    import json

    from elastic_attention.training import TrainConfig, train

    summary = train(TrainConfig.from_yaml(args.config, args.overrides), resume=args.resume,
                    progress=not args.no_progress, overwrite=args.overwrite)
    print(json.dumps({key: summary[key] for key in ("steps", "seconds", "adapter") if key in summary}, indent=2))


def _run_pretrain(args: argparse.Namespace) -> None:
    import json

    from elastic_attention.training.pretrain import pretrain
    from elastic_attention.training.pretrain_config import PretrainConfig

    summary = pretrain(PretrainConfig.from_yaml(args.config, args.overrides), resume=args.resume,
                       progress=not args.no_progress, overwrite=args.overwrite)
    print(json.dumps({key: summary[key] for key in ("steps", "tokens", "train_seconds", "model")}, indent=2))


def _run_eval(args: argparse.Namespace) -> None:
    from elastic_attention.evaluation.pipeline import resolve_tasks, run_eval_command

    tasks = resolve_tasks(_split(args.tasks), args.suite)
    if "elastic" in args.modes and args.router is None:
        raise InputError("the elastic mode evaluates trained routers: pass --router ADAPTER_FOLDER")
    from elastic_attention.evaluation.runner import is_heads

    if any(map(is_heads, args.modes)) != (args.head_set is not None) or (args.head_set_msr is not None
                                                                         and args.head_set is None):
        raise InputError("the heads modes and --head-set FILE (with --head-set-msr when the file holds several "
                         "sets) go together: give both or neither")
    head_set = None
    if args.head_set is not None:
        from elastic_attention.evaluation.pipeline import check_head_set_modes
        from elastic_attention.head_sets import read_head_sets

        head_set = read_head_sets(args.head_set, option="--head-set")
        check_head_set_modes(args.modes, head_set, args.head_set_msr)
    config = {}
    if args.config is not None:
        if args.router is not None:
            raise InputError("--config and --router both set the elastic settings: the adapter's come with it, "
                             "drop --config")
        from elastic_attention.training.train_config import TrainConfig

        config = {"config": TrainConfig.from_yaml(args.config).elastic_config}
    _require_model_folder(args.model, args.router)
    print(
        run_eval_command(
            args.model, router=args.router, modes=args.modes, tasks=tasks, lengths=args.lengths,
            samples=args.samples, out=args.out,
            static_msr=args.static_msr, seed=args.seed, batch_size=args.batch_size, device=args.device,
            dtype=args.dtype, head_set=head_set, head_set_msr=args.head_set_msr, overwrite=args.overwrite,
            rows_dir=args.rows, **config,
        )
    )


def _run_rows(args: argparse.Namespace) -> None:
    from transformers import AutoTokenizer

    from elastic_attention.evaluation.pipeline import resolve_tasks
    from elastic_attention.evaluation.row_cells import write_cells

    tasks = resolve_tasks(_split(args.tasks), args.suite)
    if not Path(args.tokenizer).is_dir():
        raise InputError(f"--tokenizer {args.tokenizer} is not a folder: give the model's folder")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    write_cells(tokenizer, tasks, args.lengths, args.samples, args.seed, args.out,
                echo=lambda text: print(text, flush=True))


def _run_eval_merge(args: argparse.Namespace) -> None:
    from elastic_attention.evaluation.merge import run_merge_command

    print(run_merge_command(args.files, args.out, _split(args.modes) if args.modes else None))


def _run_try(args: argparse.Namespace) -> None:
    from elastic_attention.evaluation.pipeline import resolve_tasks
    from elastic_attention.evaluation.showcase import run_try_command

    _require_model_folder(args.model, args.router)
    run_try_command(
        args.model, router=args.router, tasks=resolve_tasks(_split(args.tasks), args.suite),
        length=args.length, samples=args.samples, seed=args.seed, device=args.device, dtype=args.dtype,
        echo=lambda text: print(text, flush=True), compare=args.compare,
    )


def _run_generate(args: argparse.Namespace) -> None:
    from elastic_attention.evaluation.showcase import run_generate_command

    _require_model_folder(args.model, args.router)
    prompt = Path(args.file).read_text(encoding="utf-8") if args.file else args.prompt
    print(
        run_generate_command(
            args.model, router=args.router, prompt=prompt, max_new_tokens=args.max_new_tokens, chat=not args.raw,
            device=args.device, dtype=args.dtype, compare=args.compare,
            echo=lambda text: print(text, file=sys.stderr, flush=True),
        )
    )


def _run_models(args: argparse.Namespace) -> None:
    from elastic_attention.models import KNOWN_MODELS, fetch_model

    if args.action == "list":
        print("\n".join(f"{name}: {source.description}" for name, source in KNOWN_MODELS.items()))
    elif args.name is None:
        raise InputError(f"`models fetch` needs a model name; known: {', '.join(KNOWN_MODELS)}")
    else:
        out = fetch_model(args.name, args.out or f"artifacts/{args.name}", cache_dir=args.cache, gguf_file=args.gguf,
                          device=args.device)
        print(f"{args.name} is ready at {out}")


def _run_search_heads(args: argparse.Namespace) -> None:
    from elastic_attention.evaluation.pipeline import resolve_tasks
    from elastic_attention.head_sets.search import format_search, run_search

    tasks = resolve_tasks(_split(args.tasks), args.suite)
    config = None
    if args.config is not None:
        from elastic_attention.training.train_config import TrainConfig

        config = TrainConfig.from_yaml(args.config).elastic_config
    _require_model_folder(args.model)
    result = run_search(
        args.model, tasks=tasks, length=args.length, out=args.out, config=config, msrs=args.msr, start=args.start,
        step=args.step, search_samples=args.search_samples, search_seed=args.search_seed,
        pack_tokens=args.pack_tokens, samples=args.samples, batch_size=args.batch_size, device=args.device,
        dtype=args.dtype, echo=lambda text: print(text, file=sys.stderr, flush=True),
    )
    print(f"head sets of {', '.join(tasks)} at {args.length} tokens written to {args.out}:\n{format_search(result)}")


#: command -> the function that carries it out.
_RUNNERS = {
    "bench": _run_bench,
    "demo": _run_demo,
    "train": _run_train,
    "pretrain": _run_pretrain,
    "eval": _run_eval,
    "rows": _run_rows,
    "eval-merge": _run_eval_merge,
    "try": _run_try,
    "generate": _run_generate,
    "models": _run_models,
    "search-heads": _run_search_heads,
    "lm-eval": lambda args: run_lm_eval(args.arguments),  # after an option of ours (`main` takes it otherwise)
}


def _check_outputs(args: argparse.Namespace) -> None:
    """Check every output folder of a command that writes one (train and pretrain check theirs as they claim them,
    eval as it claims --out) before any work: exit 2 and one line when it cannot be written."""
    from elastic_attention.folders import check_writable

    if args.command in ("demo", "eval-merge"):
        check_writable(args.out, f"the {args.command} results")
    elif args.command == "search-heads":
        check_writable(Path(args.out).parent, "the head-set file")
    elif args.command == "models" and args.action == "fetch" and args.name:
        check_writable(Path(args.out or f"artifacts/{args.name}").parent, "the model")
    elif args.command == "bench":
        options = args.options
        outs = [options[i + 1] for i, item in enumerate(options[:-1]) if item == "--out"]
        outs += [item.split("=", 1)[1] for item in options if item.startswith("--out=")]
        for out in outs:
            check_writable(Path(out).parent, "the benchmark's results")


def _require_model_folder(path: str, router: str | None = None) -> None:
    """One line, before anything loads, when --model is not a local model folder or --router not a folder: models
    are never downloaded at run time."""
    from elastic_attention.models import KNOWN_MODELS

    folder = Path(path)
    if not (folder / "config.json").is_file():
        found = "no such folder" if not folder.exists() else "a folder without config.json"
        raise InputError(
            f"--model {path}: {found}; give a local Hugging Face model folder (config.json, weights, tokenizer): "
            f"`elastic-attention models fetch NAME` writes one to artifacts/NAME (NAME: {', '.join(KNOWN_MODELS)}), "
            f"or save your own with model.save_pretrained(FOLDER)")
    if router is not None:
        from elastic_attention.assets import router_path, shipped_routers

        try:
            router_path(router)
        except FileNotFoundError:
            raise InputError(f"--router {router}: no such adapter folder (save_router writes one), nor a shipped "
                             f"router's name ({', '.join(shipped_routers())})") from None


#: What `elastic-attention lm-eval --help` prints before lm_eval's own help (alone where the extra is missing).
LM_EVAL_USAGE = """usage: elastic-attention lm-eval [lm_eval's own arguments]

Runs lm-evaluation-harness's command line (`lm_eval ...`) with the model type `elastic-attention` registered: a
Hugging Face model folder with a router attached (--model_args pretrained=MODEL_FOLDER,router=ADAPTER_OR_NAME, and
optionally backend=auto|fa4|flex|cpu|reference, dtype=float32|bfloat16, device=cpu|cuda). Every other argument is
lm_eval's (--tasks, --batch_size, --limit, --include_path, --output_path, ...).
Needs the lm-eval extra (lm-evaluation-harness with RULER's offline generators): pip install 'elastic-attention[lm-eval]'

example:
  elastic-attention lm-eval --model elastic-attention \\
      --model_args pretrained=artifacts/qwen2.5-coder-0.5b-instruct,router=qwen2.5-coder-0.5b-instruct \\
      --tasks niah_single_1 --metadata '{"max_seq_lengths": [8192]}' --batch_size 1 --limit 20
"""


def run_lm_eval(arguments: list[str]) -> int:
    """lm-evaluation-harness's command line with the ``elastic-attention`` model type registered; ``--help`` (or no
    arguments) first prints `LM_EVAL_USAGE`, and alone where the lm-eval extra is missing."""
    wants_help = not arguments or "-h" in arguments or "--help" in arguments
    if wants_help:
        print(LM_EVAL_USAGE)
    try:
        import elastic_attention.harness  # noqa: F401  (registers the model type)
    except (InputError, ImportError) as error:
        if wants_help:
            print("lm-eval is not installed here: pip install 'elastic-attention[lm-eval]' (then --help shows "
                  "lm_eval's own options too)")
            return 0
        print(f"elastic-attention lm-eval: error: {error}", file=sys.stderr)
        return 2
    if wants_help:
        print("lm_eval's own options:\n")
    from lm_eval.__main__ import cli_evaluate

    from elastic_attention.evaluation.ruler import no_downloads

    saved, sys.argv = sys.argv, ["lm_eval", *arguments]
    try:
        with no_downloads():  # RULER's module asks nltk for a sentence splitter that its offline tasks never use
            cli_evaluate()
    finally:
        sys.argv = saved
    return 0


def mode_list(text: str) -> list[str]:
    """A comma list of evaluation modes, checked against the known modes."""
    from elastic_attention.evaluation.runner import check_modes

    try:
        return check_modes(_split(text))
    except InputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


if __name__ == "__main__":
    sys.exit(main())
