"""Optional kernel libraries stay optional: importing the package (and its training and evaluation) loads none.

Where Triton is installed, transformers' model code imports it through torch._dynamo (transformers 5.24:
`modeling_utils` -> `finegrained_fp8` -> `torch._dynamo`), so the check is what the package adds on top of torch and
transformers' model code, and that its own Triton kernels module is not loaded.
"""

import subprocess
import sys

OPTIONAL = ("triton", "flash_attn", "gguf", "matplotlib", "elastic_attention.cache.triton_decode_kernels",
            "elastic_attention.kernels.grouped_gemv_kernel")


def test_import_loads_no_optional_kernel_library():
    code = (
        "import sys, torch, transformers; from transformers import AttentionInterface, PreTrainedModel; "
        "before = set(sys.modules); "
        "import elastic_attention, elastic_attention.cache, elastic_attention.training, "
        "elastic_attention.training.pretrain, elastic_attention.evaluation.pipeline; "
        f"print(sorted(m for m in set(sys.modules) - before if m.startswith({OPTIONAL!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


#: What each inner package may import from the package (anywhere in its modules, inside functions too): the
#: patterns, the router and the kernels know nothing of training, evaluation or the Hugging Face glue, and the cache
#: finds its routing through `elastic_attention.attached`, not the integration.
ALLOWED_IMPORTS = {
    "patterns": {"patterns", "config", "errors"},
    "router": {"router", "patterns", "errors"},
    "backends": {"backends", "patterns", "errors"},
    "cache": {"cache", "patterns", "attached", "errors"},
    "kernels": {"kernels", "errors"},
}


def test_inner_packages_import_only_what_their_layer_allows():
    import ast
    from pathlib import Path

    import elastic_attention

    root = Path(elastic_attention.__file__).parent
    for package, allowed in ALLOWED_IMPORTS.items():
        for path in sorted((root / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
                names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    if name.startswith("elastic_attention."):
                        assert name.split(".")[1] in allowed, f"{path.name} imports {name}"


#: Inside the Hugging Face glue, the routing and the attention computed from it know nothing of the hooks, the
#: bounded cache or training: the runtime composes them.
ALLOWED_MODULE_IMPORTS = {
    "integration/routing.py": ("config", "errors", "integration.report", "patterns", "router"),
    "integration/hybrid_attention.py": ("backends", "cache.token_attention", "config", "patterns", "router"),
}


def test_routing_and_hybrid_attention_import_no_hooks_cache_or_training():
    import ast
    from pathlib import Path

    import elastic_attention

    root = Path(elastic_attention.__file__).parent
    for relative, allowed in ALLOWED_MODULE_IMPORTS.items():
        for node in ast.walk(ast.parse((root / relative).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("elastic_attention."):
                name = node.module.removeprefix("elastic_attention.")
                assert name.startswith(allowed), f"{relative} imports elastic_attention.{name}"


def test_the_command_line_answers_help_and_version_without_torch():
    """`--help` and `--version` parse arguments only: neither torch nor transformers is imported for them."""
    code = ("import sys; from elastic_attention.cli import main\n"
            "for argv in (['--help'], ['--version'], ['eval', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print('LOADED', sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "elastic-attention 0.1.0" in result.stdout and "usage: elastic-attention eval" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "LOADED []"
