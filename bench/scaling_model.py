#!/usr/bin/env python3
"""Data-parallel training on paper: an alpha-beta model of a ring allreduce against a measured step.

    tapeformer bench train --name default ... > steps.jsonl   (one JSON line per configuration)
    python3 bench/scaling_model.py steps.jsonl [--alpha-us 30] [--efficiency 0.9]

For each configuration (its `params` and median step time `ms_per_step_median`, with `phase_ms.bwd` and
`tgt_tokens_per_s`, as `tapeformer bench train` prints them), R machines like the one measured, each
computing one micro-batch of the measured size, and a network of B Gbit/s:

  (--node-speedup S: machines S times faster, each step time divided by S)
  gradient bytes        n = 4 * params                     (fp32 gradients, bf16 training too)
  ring allreduce        T(R) = 2 (R - 1) (alpha + n / (R * beta))     beta = efficiency * B / 8 bytes/s
  efficiency            E = t / (t + T)                    the reduction after the backward pass
                        E_overlap = t / (t + max(0, T - t_bwd))       fully hidden behind the backward pass
  batch for E >= 80%    t must be >= 4 T: tokens per machine >= 4 T * r (r: target tokens/s of one
                        machine, measured); the global batch is R times that

Prints a Markdown table. alpha and the link efficiency are assumptions, not measurements: say so.
"""
import argparse
import json

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("steps", help="JSON lines of `tapeformer bench train`")
parser.add_argument("--alpha-us", type=float, default=30.0, help="latency per message, microseconds (MPI over TCP)")
parser.add_argument("--efficiency", type=float, default=0.9, help="share of the line rate a large message gets")
parser.add_argument("--node-speedup", type=float, default=1.0,
                    help="machines this many times faster than the one measured (its step time divided by it)")
parser.add_argument("--ranks", default="2,4,8,16,32,64")
parser.add_argument("--gbits", default="10,25")
args = parser.parse_args()

alpha = args.alpha_us * 1e-6
ranks = [int(r) for r in args.ranks.split(",")]
networks = [float(g) for g in args.gbits.split(",")]
with open(args.steps, encoding="utf-8") as f:
    configs = [json.loads(line) for line in f if line.strip()]

print(f"alpha {args.alpha_us:g} us per message, {args.efficiency:.0%} of the line rate (assumed); "
      f"step times and rates measured (below), machines {args.node_speedup:g}x the one measured\n")
for c in configs:
    n = 4.0 * c["params"]
    t = c["ms_per_step_median"] / 1e3 / args.node_speedup
    t_bwd = c["phase_ms"]["bwd"] / 1e3 / args.node_speedup
    rate = c["tgt_tokens_per_s"] * args.node_speedup  # target tokens per second of one machine
    tokens = rate * t                                 # target tokens of one machine's micro-batch
    print(f"**{c['name']}**: {c['params'] / 1e6:.1f} M parameters ({n / 2**20:.0f} MiB of gradients), "
          f"step {t * 1e3:.0f} ms (backward {t_bwd * 1e3:.0f} ms) for {tokens:.0f} target tokens\n")
    print("| machines | network | allreduce | efficiency | with overlap | batch for 80% (target tokens, global) |")
    print("|---:|---|---:|---:|---:|---:|")
    for gbit in networks:
        beta = args.efficiency * gbit * 1e9 / 8
        for r in ranks:
            reduce = 2 * (r - 1) * (alpha + n / (r * beta))
            e = t / (t + reduce)
            e_overlap = t / (t + max(0.0, reduce - t_bwd))
            need = 4 * reduce * rate * r
            print(f"| {r} | {gbit:g} Gbit/s | {reduce * 1e3:.0f} ms | {e:.0%} | {e_overlap:.0%} | {need:,.0f} |")
    print()
