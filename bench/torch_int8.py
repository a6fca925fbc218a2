#!/usr/bin/python3
"""PyTorch's dynamic int8 quantisation on the benchmark's model, beside tapeformer's --precision int8.

Run with Debian's interpreter (python3-torch 1.13):
    /usr/bin/python3 bench/torch_int8.py --threads 1 [torch_ref.py's model flags]

Builds ../shared/bench/torch_ref.py's model (same flags, same batch), times its cached greedy decoding
(64 sentences, 20 steps) in fp32, then after torch.ao.quantization.quantize_dynamic({nn.Linear}, qint8) on
the oneDNN quantised engine (Debian's torch has no fbgemm), alternating the two `--rounds` times. What
quantize_dynamic converts in this model: the FFN's two Linear layers and the output projection; attention's
in_proj weights are parameters read by F.linear and its out_proj is a NonDynamicallyQuantizableLinear, so
those stay fp32 (PyTorch's own result on nn.Transformer). Prints one JSON line.
"""
import json
import os
import sys
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "shared", "bench"))
rounds = 3
if "--rounds" in sys.argv:
    i = sys.argv.index("--rounds")
    rounds = int(sys.argv[i + 1])
    del sys.argv[i:i + 2]
import torch_ref  # noqa: E402  parses sys.argv (its flags) and sets the thread counts before torch loads

import torch  # noqa: E402
from torch import nn  # noqa: E402


def main():
    a = torch_ref.args
    B, S, T, V = a.batch, a.src_len, a.tgt_len, a.vocab
    model = torch_ref.Seq2SeqTransformer(V, a.d_model, a.heads, a.ffn, a.enc_layers, a.dec_layers, a.dropout,
                                         max(S, T) + 8, a.tie_embeddings).eval()
    g = torch.Generator().manual_seed(a.seed)
    src = torch_ref.make_batch(g, B, S, T, V, a.min_len_frac)[0]
    kpm = src == torch_ref.PAD
    torch.backends.quantized.engine = "onednn"
    qmodel = torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)
    for layer in qmodel.encoder.layers:  # 1.13's encoder fast path reads linear1.weight, a method once quantised:
        layer.activation_relu_or_gelu = 0  # this sends it down the ordinary path (the same ReLU)
    quantised = sorted(n for n, m in qmodel.named_modules() if type(m).__module__.startswith("torch.ao.nn.quantized") and not n.endswith("_packed_params"))

    def tokens_per_s(m):
        m.greedy_cached(src, kpm, T)  # untimed
        t0 = time.perf_counter()
        for _ in range(a.eval_reps):
            m.greedy_cached(src, kpm, T)
        return B * T * a.eval_reps / (time.perf_counter() - t0)

    fp32, int8 = [], []
    for _ in range(rounds):  # alternating: the machine is shared
        fp32.append(tokens_per_s(model))
        int8.append(tokens_per_s(qmodel))
    same = bool(torch.equal(model.greedy_cached(src, kpm, T), qmodel.greedy_cached(src, kpm, T)))
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "threads": a.threads, "engine": "onednn",
                      "greedy_cached_tokens_per_s_fp32": fp32, "greedy_cached_tokens_per_s_int8": int8,
                      "int8_same_tokens_as_fp32": same, "quantised_modules": quantised}))


if __name__ == "__main__":
    main()
