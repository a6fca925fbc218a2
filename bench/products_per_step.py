#!/usr/bin/env python3
"""Sums the matrix products of one training step of the default benchmark model (d 256, 3+3 layers,
V 8000, batch 64x20) from bench_matmul's --json rows: once as raw cblas_sgemm, once as tf::matmul.
Set the step's time (tapeformer bench train) against the raw sum to see how much of it is outside the
products (issue #12 section 1 asks for at most 15%).

    ./build/bench/bench_matmul --threads 2 --json > products.json
    python3 bench/products_per_step.py products.json
"""
import json
import sys


def main(path):
    ms = {}  # (case, op, raw variant) -> (raw_ms, library_ms), for the 3-D cases (as the layers see them)
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            if row["case"].endswith("2-D"):
                continue
            ms[(row["case"].replace(" 3-D", ""), row["op"], row["raw"])] = (row["raw_ms"], row["library_ms"])

    for column, label in ((0, "raw sgemm"), (1, "tf::matmul")):
        def linear(case):  # forward and backward
            return sum(ms[(case, op, "sgemm")][column] for op in ("fwd", "bwd"))

        def attention(case):
            return sum(ms[(case, op, "sgemm omp loop")][column] for op in ("fwd", "bwd"))

        proj, qkv = linear("proj 256->256"), linear("qkv 256->768")
        key_value = proj + (qkv - proj) * (512 - 256) / (768 - 256)  # cross-attention's 256 -> 512: not a bench shape
        ffn = linear("ffn up 256->1024") + linear("ffn down 1024->256")
        products = attention("attn Q.K^T") + attention("attn P.V")
        encoder_layer = qkv + proj + ffn + products
        decoder_layer = qkv + proj + (proj + key_value + proj) + ffn + 2 * products
        logits = linear("logits 256->8000")
        total = 3 * encoder_layer + 3 * decoder_layer + logits
        print(f"{label}: one step's products {total:.1f} ms (encoder layer {encoder_layer:.1f}, "
              f"decoder layer {decoder_layer:.1f}, logits {logits:.1f})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: products_per_step.py BENCH_MATMUL_JSON")
    main(sys.argv[1])
