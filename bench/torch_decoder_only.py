#!/usr/bin/python3
"""PyTorch CPU reference for `tapeformer bench train --arch decoder-only`: train-step throughput of a small
post-norm decoder-only Transformer (a GPT block stack), built the way ../shared/bench/torch_ref.py builds its
encoder-decoder, with the same flags, defaults, batches and optimizer.

Run with Debian's interpreter (python3-torch):   /usr/bin/python3 bench/torch_decoder_only.py --threads 2

Model: token embedding (V, d) * sqrt(d) + sinusoidal positions, dropout; --layers x nn.TransformerEncoderLayer
(batch_first, post-norm, ReLU FFN) run with a causal mask and a key padding mask: causal self-attention and
the FFN, no cross-attention (tapeformer's decoder layer without its cross-attention sublayer);
Linear(d, V) output projection with bias. Loss CrossEntropyLoss(label_smoothing, ignore_index=PAD);
Adam(0.9, 0.98, eps 1e-9), Noam schedule, grad-norm clipping. Batches: torch_ref.py's target side,
dec_in = BOS + words, labels = words + EOS, lengths uniform in [ceil(min_len_frac*T), T].

Threads: --threads sets torch.set_num_threads and OPENBLAS_NUM_THREADS/OMP_NUM_THREADS before torch loads.
Prints one human-readable line, then one JSON line with torch_ref.py's keys.
"""
import argparse
import json
import math
import os
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--layers", type=int, default=3, help="decoder layers")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--batch", type=int, default=64, help="sequences per batch")
    p.add_argument("--tgt-len", type=int, default=20, help="positions T (input = BOS+tokens, labels shifted)")
    p.add_argument("--min-len-frac", type=float, default=0.75)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=4000)
    p.add_argument("--bench-warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--name", type=str, default="")
    return p.parse_args()


args = parse()
os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
os.environ["OMP_NUM_THREADS"] = str(args.threads)

import torch  # noqa: E402
from torch import nn  # noqa: E402

torch.set_num_threads(args.threads)
torch.manual_seed(args.seed)
PAD, BOS, EOS = 0, 1, 2
FIRST_WORD = 4


def sinusoid_table(n_pos, d):
    pe = torch.zeros(n_pos, d)
    pos = torch.arange(n_pos, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


class DecoderOnly(nn.Module):
    def __init__(self, V, d, h, f, n, dropout, max_len):
        super().__init__()
        self.d = d
        self.emb = nn.Embedding(V, d, padding_idx=PAD)
        self.register_buffer("pe", sinusoid_table(max_len, d), persistent=False)
        self.drop = nn.Dropout(dropout)
        layer = nn.TransformerEncoderLayer(d, h, f, dropout, batch_first=True, norm_first=False)
        self.blocks = nn.TransformerEncoder(layer, n, norm=None, enable_nested_tensor=False)
        self.out = nn.Linear(d, V)
        for name, p in self.named_parameters():
            if p.dim() > 1 and "emb" not in name:
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.emb.weight, 0.0, d ** -0.5)

    def forward(self, ids, kpm):
        T = ids.size(1)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        x = self.drop(self.emb(ids) * math.sqrt(self.d) + self.pe[:T])
        return self.out(self.blocks(x, mask=causal, src_key_padding_mask=kpm))


def make_batch(g, B, T, V, min_frac):
    """torch_ref.py's target side: BOS + (len-1) words + EOS, right-padded."""
    lo = max(1, math.ceil(min_frac * T))
    lens = torch.randint(lo, T + 1, (B,), generator=g)
    body = torch.randint(FIRST_WORD, V, (B, T), generator=g)
    body[torch.arange(T).unsqueeze(0) >= lens.unsqueeze(1)] = PAD
    seq = torch.full((B, T + 1), PAD, dtype=torch.long)
    seq[:, 0] = BOS
    seq[:, 1:] = body
    seq[torch.arange(B), lens] = EOS
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def main():
    a = args
    B, T, V = a.batch, a.tgt_len, a.vocab
    model = DecoderOnly(V, a.d_model, a.heads, a.ffn, a.layers, a.dropout, T + 8)
    n_params = sum(p.numel() for p in model.parameters())
    crit = nn.CrossEntropyLoss(ignore_index=PAD, label_smoothing=a.label_smoothing)
    opt = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    params = list(model.parameters())
    g = torch.Generator().manual_seed(a.seed)
    batches = [make_batch(g, B, T, V, a.min_len_frac) for _ in range(8)]
    step_no = [0]

    def train_step(batch):
        dec_in, labels = batch
        step_no[0] += 1
        lr = a.d_model ** -0.5 * min(step_no[0] ** -0.5, step_no[0] * a.warmup_steps ** -1.5)
        for pg in opt.param_groups:
            pg["lr"] = lr
        logits = model(dec_in, dec_in == PAD)
        loss = crit(logits.view(-1, V), labels.view(-1))
        loss.backward()
        if a.clip > 0:
            torch.nn.utils.clip_grad_norm_(params, a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    model.train()
    for i in range(a.bench_warmup):
        train_step(batches[i % len(batches)])
    times, losses = [], []
    for i in range(a.steps):
        t0 = time.perf_counter()
        losses.append(train_step(batches[i % len(batches)]).item())
        times.append(time.perf_counter() - t0)
    tot = sum(times)
    result = {"name": a.name, "arch": "decoder-only", "torch": torch.__version__, "threads": a.threads,
              "config": {"d_model": a.d_model, "heads": a.heads, "ffn": a.ffn, "dec_layers": a.layers, "vocab": V,
                         "batch": B, "tgt_len": T, "min_len_frac": a.min_len_frac, "dropout": a.dropout},
              "params": n_params, "steps": a.steps, "ms_per_step": 1000 * tot / a.steps,
              "ms_per_step_median": 1000 * sorted(times)[len(times) // 2], "ms_per_step_min": 1000 * min(times),
              "tgt_tokens_per_s": B * T * a.steps / tot, "loss_first": losses[0], "loss_last": losses[-1]}
    print(f"torch {torch.__version__} decoder-only: d={a.d_model} h={a.heads} ffn={a.ffn} layers={a.layers} V={V} "
          f"params={n_params:,}; batch {B}x{T}: {result['ms_per_step']:.1f} ms/step, "
          f"{result['tgt_tokens_per_s']:.0f} tok/s; loss {losses[0]:.3f} -> {losses[-1]:.3f}", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
