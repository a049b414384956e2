"""Which launch options make the fused decode kernel fastest on this GPU, and how close to the copy bandwidth is it?

Builds one decoder layer's bounded cache by hand (Hkv KV heads of head_dim D per sequence; round((1 - MSR) x B x Hkv)
of the layer's B x Hkv segments full stores of ``length`` entries, spread over the sequences, the rest rings of
sink + local slots; the key splits cover the longest segment, as the cache's) at each (length, batch) point, and
times `decode_step` with each candidate `DecodeKernelOptions` (one step captured as a CUDA graph and replayed, so no
host time is counted); a step reads every kept entry once, so its achieved bandwidth is those bytes over its time,
next to the copy bandwidth measured in the same run. Each candidate's output is checked against the first
candidate's, from the same state, at every point. "fastest" is the candidate of least total time over the points:
what `triton_decode.DEFAULT_KERNEL_OPTIONS` should hold for this GPU (or what to pass as ``kernel_options``).

  python3 studies/kernel_tuning/decode_kernel_sweep.py --lengths 32k,128k --batch 1,8 --out /tmp/decode_kernel_sweep.json
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from elastic_attention.bench.timing import copy_bandwidth, parse_tokens, run_header, timed, write_result
from elastic_attention.cache.triton_decode import DecodeKernelOptions, DecodeSegments, decode_step
from elastic_attention.integration.decode_graph import capture_graph

def _candidate(programs: int, splits: int, stages: int = 3, warps: int = 4, block: int = 64,
               least: int = 0) -> DecodeKernelOptions:
    return DecodeKernelOptions(block_keys=block, num_warps=warps, num_stages=stages, programs_per_processor=programs,
                               max_splits=splits, min_split_keys=least)


#: Named p<programs per SM>_s<most splits>_st<stages> (and _w<warps>, _n<keys per block> where not 4 and 64, _k<least
#: keys per split> where set). With
#: head_dim 128, 64 keys a block and 3 stages take 96 KB of shared memory, so 2 programs fit on an SM (3 with 2
#: stages, 1 with 4): "p2_s1024_st3" and "p3_s1024_st2" aim at one wave of programs over the step's entries.
CANDIDATES = {
    "default": DecodeKernelOptions(),
    "p8_s128_st3": _candidate(8, 128),
    "p8_s256_st3": _candidate(8, 256),
    "p4_s64_st3": _candidate(4, 64),
    "p16_s512_st3": _candidate(16, 512),
    "p2_s1024_st3": _candidate(2, 1024),
    "p4_s1024_st3": _candidate(4, 1024),
    "p1_s1024_st4": _candidate(1, 1024, stages=4),
    "p6_s1024_st2": _candidate(6, 1024, stages=2),
    "p3_s1024_st2_w8": _candidate(3, 1024, stages=2, warps=8),
    "p3_s1024_st2_n128": _candidate(3, 1024, stages=2, block=128),
    "p3_s1024_st2_k512": _candidate(3, 1024, stages=2, least=512),
    "p3_s1024_st2_k1024": _candidate(3, 1024, stages=2, least=1024),
    "p6_s1024_st2_k1024": _candidate(6, 1024, stages=2, least=1024),
}


def layer_cache(length: int, batch: int, args, device: torch.device):
    """(segments, storage kept alive, max entries, total entries, bytes read by a step) of one layer's cache."""
    generator = torch.Generator(device).manual_seed(length + batch)
    count = batch * args.kv_heads
    full_count = round((1.0 - args.msr) * count)
    is_full = [(s + 1) * full_count // count > s * full_count // count for s in range(count)]  # spread evenly
    ring_size = args.sink + args.local
    full = torch.randn(max(1, full_count), length + 256, args.head_dim, device=device, dtype=torch.bfloat16,
                       generator=generator)
    full_values = torch.randn_like(full)
    rings = torch.randn(max(1, count - full_count), ring_size, args.head_dim, device=device, dtype=torch.bfloat16,
                        generator=generator)
    ring_values = torch.randn_like(rings)
    positions = torch.arange(ring_size, device=device).repeat(rings.shape[0], 1)  # any permutation of visible ones
    columns, next_full, next_ring, entries = [[], [], [], []], 0, 0, 0
    for full_store in is_full:
        if full_store:
            keys, values, address = full[next_full], full_values[next_full], 0
            next_full += 1
            entries += length + 1
        else:
            keys, values = rings[next_ring], ring_values[next_ring]
            address = positions[next_ring].data_ptr()
            next_ring += 1
            entries += ring_size
        columns[0].append(keys.data_ptr())
        columns[1].append(values.data_ptr())
        columns[2].append(address)
        columns[3].append(length)
    segments = DecodeSegments.from_columns(*columns, num_kv_heads=args.kv_heads, device=device)
    read = entries * args.head_dim * 2 * full.element_size()
    longest = length + 1 + args.spare if full_count else min(length + 1, ring_size)
    return segments, (full, full_values, rings, ring_values, positions), longest, entries, read


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=parse_tokens, default=parse_tokens("32k,128k"))
    parser.add_argument("--batch", type=lambda t: [int(b) for b in t.split(",")], default=[1, 8])
    parser.add_argument("--msr", type=float, default=0.7)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--sink", type=int, default=128)
    parser.add_argument("--local", type=int, default=2048)
    parser.add_argument("--spare", type=int, default=64,
                        help="entries the splits cover past a full store's (a captured step's capacity beyond it)")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--candidates", help="comma-separated names (default: all)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    names = args.candidates.split(",") if args.candidates else list(CANDIDATES)
    bandwidth = copy_bandwidth(device)
    rows, totals = [], {name: 0.0 for name in names}
    for length in args.lengths:
        for batch in args.batch:
            segments, storage, max_entries, total, read = layer_cache(length, batch, args, device)
            start = segments.lengths.clone()
            generator = torch.Generator(device).manual_seed(7)
            query = torch.randn(batch, args.kv_heads * args.group, 1, args.head_dim, device=device,
                                dtype=torch.bfloat16, generator=generator)
            new = torch.randn(2, batch, args.kv_heads, 1, args.head_dim, device=device, dtype=torch.bfloat16,
                              generator=generator)

            def step(options):
                return decode_step(query, new[0], new[1], segments, args.head_dim**-0.5, sink_tokens=args.sink,
                                   local_tokens=args.local, max_entries=max_entries, total_entries=total,
                                   options=options)

            outputs = {}
            for name in names:  # every candidate's output from the same state (a step rewrites one ring slot)
                try:
                    outputs[name] = step(CANDIDATES[name]).float()
                except Exception as error:  # a candidate that does not compile or launch is reported, not fatal
                    outputs[name] = f"{type(error).__name__}: {error}"[:400]
                segments.lengths.copy_(start)
            first = next((output for output in outputs.values() if isinstance(output, torch.Tensor)), None)
            for name in names:
                options = CANDIDATES[name]
                row = {"length": length, "batch": batch, "candidate": name, "options": dataclasses.asdict(options)}
                if isinstance(outputs[name], str):
                    row["error"] = outputs[name]
                    totals.pop(name, None)
                else:
                    row["max_difference_vs_first"] = float((outputs[name] - first).abs().max())
                    graph, _ = capture_graph(lambda: step(options), [segments.lengths])  # GPU time, no host
                    row["step_s"] = timed(graph.replay, device, args.repeats, warmup=3)
                    segments.lengths.copy_(start)
                    del graph
                    row["bytes_read"] = read
                    row["achieved_bandwidth_bytes_per_s"] = read / row["step_s"]
                    row["share_of_copy_bandwidth"] = row["achieved_bandwidth_bytes_per_s"] / bandwidth
                    if name in totals:
                        totals[name] += row["step_s"]
                rows.append(row)
                print(row, flush=True)
            segments = None
            del storage
            torch.cuda.empty_cache()
    fastest = min(totals, key=totals.get)
    write_result(args.out, {
        **run_header(device), "copy_bandwidth_bytes_per_s": bandwidth, "msr": args.msr, "kv_heads": args.kv_heads,
        "group": args.group, "head_dim": args.head_dim, "sink": args.sink, "local": args.local,
        "total_step_s": totals, "fastest": {"name": fastest, "options": dataclasses.asdict(CANDIDATES[fastest])},
        "results": rows,
    })
    print(f"fastest: {fastest} {totals[fastest]:.6f} s summed; default {totals.get('default')}")


if __name__ == "__main__":
    main()
