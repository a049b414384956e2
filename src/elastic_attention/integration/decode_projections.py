"""A decoder layer's linear projections as `kernels.grouped_gemv` launches, in a captured decode step at a small batch.

`projection_groups` finds every ``nn.Linear`` of the decoder layers and groups those that read the same input by
their names (q, k and v; gate and up: the Llama family's, which every supported family but gpt-oss's experts
shares); any other projection (o, down) is a group of one. Inside `grouped_projections` each projection's
``forward`` is its group's: the first member called with 1 to `GROUPED_ROWS` rows of input (one row for a group of
one) computes the whole group in one launch and keeps the outputs; a member then called with that same input tensor
returns its part. Any other call (more rows, another input, a dtype or device the kernel does not take) runs
``torch.nn.functional.linear`` as before.
Forward hooks (the router's key hook on k_proj) run as usual: only ``forward`` changes, and only inside the block.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from elastic_attention.integration.module_forwards import replaced_forwards
from elastic_attention.kernels.grouped_gemv import MAX_WEIGHTS, grouped_gemv_available, grouped_linear_op

#: Projections of one decoder layer that read the same input, by their paths under the layer.
SHARED_INPUT_PROJECTIONS = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                            ("mlp.gate_proj", "mlp.up_proj"))


#: The most rows of input (a decode step's batch) whose projections run grouped; more go to cuBLAS. At 2 or more rows
#: only groups of several projections (q/k/v, gate/up) run grouped: the several-row kernel beat cuBLAS on those and
#: lost on o and down alone, whose long reductions cuBLAS splits (docs/how-it-works.md, "Numbers behind the
#: defaults"). Measured at 8 rows only, so 8 is the limit.
GROUPED_ROWS = 8


class ProjectionGroup:
    """Linear layers that read one input (1 to `MAX_WEIGHTS`, same input size, dtype and device, all with a bias or
    none), computed together for 1 to `GROUPED_ROWS` rows of input (a group of one: for one row)."""

    def __init__(self, linears: list[nn.Linear]) -> None:
        self.linears = linears
        weight = linears[0].weight
        # Decided here, not in `forward`: a compiled layer traces `forward`, and Dynamo before pytorch/pytorch#179629
        # (torch 2.11 among them; pytorch/ao#4279) breaks the graph at `importlib.util.find_spec`, which split each
        # layer's fused elementwise kernels apart (silu, mul and the residual add ran as three).
        self.kernel_available = grouped_gemv_available(weight.device, weight.dtype)
        self._input: torch.Tensor | None = None
        self._outputs: list[torch.Tensor] = []

    def forward_of(self, index: int):
        """The ``forward`` of member ``index``: [..., K] -> [..., N_index]."""
        linear = self.linears[index]

        def forward(x: torch.Tensor) -> torch.Tensor:
            weight = linear.weight
            inputs = x.numel() // x.shape[-1]
            if (inputs > GROUPED_ROWS or (inputs > 1 and len(self.linears) == 1) or not self.kernel_available
                    or x.dtype != weight.dtype or x.device != weight.device):
                return F.linear(x, weight, linear.bias)
            if self._input is not x:
                biases = [member.bias for member in self.linears] if linear.bias is not None else []
                self._outputs = grouped_linear_op(x, [member.weight for member in self.linears], biases)
                self._input = x
            return self._outputs[index]

        return forward

    def forget(self) -> None:
        """Drop the kept input and outputs."""
        self._input, self._outputs = None, []


def _compatible(linears: list[nn.Linear]) -> bool:
    first = linears[0]
    return all(linear.weight.is_contiguous() and linear.in_features == first.in_features
               and linear.weight.dtype == first.weight.dtype and linear.weight.device == first.weight.device
               and (linear.bias is None) == (first.bias is None) for linear in linears)


def projection_groups(layers: list[nn.Module]) -> list[ProjectionGroup]:
    """Every plain ``nn.Linear`` of ``layers``, grouped by `SHARED_INPUT_PROJECTIONS` where a layer has all of a
    group's members and they fit one launch; every other one alone (subclasses such as quantized layers are left
    out)."""
    groups = []
    for layer in layers:
        linears = {name: module for name, module in layer.named_modules() if type(module) is nn.Linear}
        for names in SHARED_INPUT_PROJECTIONS:
            members = [linears.get(name) for name in names]
            if None not in members and len(members) <= MAX_WEIGHTS and _compatible(members):
                groups.append(ProjectionGroup(members))
                for name in names:
                    del linears[name]
        groups.extend(ProjectionGroup([linear]) for linear in linears.values() if _compatible([linear]))
    return groups


@contextlib.contextmanager
def grouped_projections(layers: list[nn.Module]):
    """Inside the block, the projections of ``layers`` run as `projection_groups`' launches (see the module's
    docstring); their own ``forward`` is back after it."""
    groups = projection_groups(layers)
    try:
        with replaced_forwards([(linear, group.forward_of(index)) for group in groups
                                for index, linear in enumerate(group.linears)]):
            yield groups
    finally:
        for group in groups:
            group.forget()
