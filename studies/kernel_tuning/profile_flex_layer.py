"""Where does the time of one flex hybrid layer go? The CUDA kernels of `FlexBackend.attend` (the dense KV heads
through SDPA, the rest through flex) at one length and MSR, summed by kernel name, against the call's time (CUDA
events), with dense cuDNN SDPA of the same shape and the SDPA call the split makes for its dense heads timed alone.
The difference between the call's time and the sum of its kernels is time the GPU waits for the host.

  python studies/kernel_tuning/profile_flex_layer.py --length 32768 --msr 0.25 [--heads 32 --kv-heads 8 --head-dim 128]
"""

from __future__ import annotations

import argparse
import collections

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from elastic_attention import ElasticConfig
from elastic_attention.backends.flex import FlexBackend
from elastic_attention.bench.timing import timed
from elastic_attention.patterns import FULL, SSA, SequenceLayout, build_block_tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=32768)
    parser.add_argument("--msr", type=float, default=0.25)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--local", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda")
    generator = torch.Generator(device).manual_seed(0)
    query = torch.randn(1, args.heads, args.length, args.head_dim, device=device, dtype=torch.bfloat16,
                        generator=generator)
    key, value = (torch.randn(1, args.kv_heads, args.length, args.head_dim, device=device, dtype=torch.bfloat16,
                              generator=generator) for _ in range(2))
    sparse = round(args.msr * args.kv_heads)
    modes = torch.tensor([[SSA] * sparse + [FULL] * (args.kv_heads - sparse)], device=device)
    layout = SequenceLayout.dense(1, args.length)
    config = ElasticConfig(block_size=128, sink_tokens=128, local_tokens=args.local)
    tables = build_block_tables(layout, modes, config, args.heads)
    scale = args.head_dim**-0.5
    group = args.heads // args.kv_heads
    dense_heads = (args.kv_heads - sparse) * group
    calls = {
        "flex split (the backend)": lambda: FlexBackend().attend(query, key, value, layout, tables, scale),
        "flex one launch": lambda: FlexBackend(dense_heads="flex").attend(query, key, value, layout, tables, scale),
        "cuDNN dense, all heads": lambda: _cudnn(query, key, value, scale),
        "cuDNN, the dense heads as one batch row": lambda: _cudnn(
            query[:, sparse * group :], key[:, sparse:], value[:, sparse:], scale),
        "cuDNN, the dense heads one batch row per KV head": lambda: _cudnn(
            query[:, sparse * group :].unflatten(1, (-1, group))[0], key[0, sparse:, None], value[0, sparse:, None],
            scale),
    }
    print(f"length {args.length}, MSR {args.msr} ({sparse} of {args.kv_heads} KV heads on SSA, {dense_heads} dense "
          f"query heads), head_dim {args.head_dim}")
    for name, call in calls.items():
        seconds = timed(call, device, args.repeats)
        print(f"{name}: {seconds * 1e3:.2f} ms", flush=True)
    split = calls["flex split (the backend)"]
    split()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as trace:
        for _ in range(args.repeats):
            split()
        torch.cuda.synchronize()
    kernels = collections.Counter()
    for event in trace.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name[:110]] += event.time_range.elapsed_us() / args.repeats
    total = sum(kernels.values())
    print(f"kernels of one split call: {total / 1e3:.2f} ms in all")
    for name, microseconds in kernels.most_common(14):
        print(f"  {microseconds / 1e3:8.3f} ms  {name}")


def _cudnn(query, key, value, scale):
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        return F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scale,
                                              enable_gqa=key.shape[1] != query.shape[1])


if __name__ == "__main__":
    main()
