"""Optional kernel libraries stay optional: importing the package (and its training and evaluation) loads none.

Where Triton is installed, transformers' model code imports it through torch._dynamo (transformers 5.24:
`modeling_utils` -> `finegrained_fp8` -> `torch._dynamo`), so the check is what the package adds on top of torch and
transformers' model code, and that its own Triton kernels module is not loaded.
"""

import subprocess
import sys

OPTIONAL = ("triton", "flash_attn", "gguf", "matplotlib", "elastic_attention.cache.triton_decode_kernels")


def test_import_loads_no_optional_kernel_library():
    code = (
        "import sys, torch, transformers; from transformers import AttentionInterface, PreTrainedModel; "
        "before = set(sys.modules); "
        "import elastic_attention, elastic_attention.cache, elastic_attention.training, "
        "elastic_attention.evaluation.pipeline; "
        f"print(sorted(m for m in set(sys.modules) - before if m.startswith({OPTIONAL!r})))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
