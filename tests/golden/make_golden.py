#!/usr/bin/python3
"""Write PyTorch reference fixtures ("golden" files) for tapeformer's C++ tests.

Usage:
    /usr/bin/python3 tests/golden/make_golden.py --out tests/golden

For each config in CONFIGS this builds the encoder-decoder Transformer with
PyTorch's nn.TransformerEncoderLayer / nn.TransformerDecoderLayer (batch_first,
dropout 0), initialises every parameter with fixed seeds, runs one fixed padded
batch, computes the label-smoothed cross-entropy loss, back-propagates and writes

    <out>/<config>/weights.safetensors   every parameter (float32), config in __metadata__
    <out>/<config>/batch.json            src / dec_in / target ids and lengths
    <out>/<config>/outputs.safetensors   logits, loss, nll, encoder_out, decoder_out, grad.<name>
    <out>/<config>/heads.safetensors     per attention (E.<layer>, D.<layer>, A.<layer>): head importance
                                         at token / sentence / batch granularity and the norms of each
                                         head's gradient slices (head_study)

All reference values are computed in float64 from weights that are exactly
representable in float32 (the weights are rounded to float32 first), then stored
as float32.  Only the Python standard library, numpy and torch are used; the
safetensors files are written by hand (struct + json).

Self-checks run before anything is written:
  * an independent, hand-written functional implementation of the same model
    (explicit q/k/v split, 1/sqrt(head_dim) scaling, -inf masks, LayerNorm,
    label-smoothing formula) must match PyTorch's modules in logits, loss and
    every gradient to ~1e-12;
  * the weights file is read back into a fresh model, which must reproduce
    the loss and logits exactly;
  * the same model run in float32 PyTorch must be within the C++ tolerance
    (max|a-b| / max|b| <= 1e-4 per tensor) of the float64 reference.
"""

import argparse
import collections
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
LABEL_SMOOTHING = 0.1
MAX_LEN = 32
LN_EPS = 1e-5
TOLERANCE = 1e-4

CONFIGS = collections.OrderedDict([
    ("post_untied", dict(src_vocab=19, tgt_vocab=23, d_model=16, heads=4, ffn=32,
                         enc_layers=2, dec_layers=2, norm="post", activation="relu",
                         tie="none", seed=1001)),
    ("pre_tied_decoder", dict(src_vocab=19, tgt_vocab=23, d_model=16, heads=2, ffn=24,
                              enc_layers=2, dec_layers=1, norm="pre", activation="gelu",
                              tie="decoder", seed=2002)),
    ("post_tied_all", dict(src_vocab=21, tgt_vocab=21, d_model=12, heads=3, ffn=20,
                           enc_layers=1, dec_layers=2, norm="post", activation="relu",
                           tie="all", seed=3003)),
])

# One fixed batch (word ids 4..18 fit every config's vocabularies; 3 = unk).
# Row 0 is unpadded on both sides; rows 1 and 2 are padded, with the source and
# target lengths ordered differently so that src and tgt masks differ per row.
SRC_WORDS = [[5, 9, 4, 17, 12, 6], [8, 3, 11, 8], [18, 7]]
TGT_WORDS = [[10, 4, 16, 6, 13], [7, 18], [12, 3, 9]]


def make_batch():
    src = [w + [EOS_ID] for w in SRC_WORDS]
    dec_in = [[BOS_ID] + w for w in TGT_WORDS]
    target = [w + [EOS_ID] for w in TGT_WORDS]
    S = max(len(r) for r in src)
    T = max(len(r) for r in dec_in)
    assert S <= 7 and T <= 6
    pad = lambda rows, n: [r + [PAD_ID] * (n - len(r)) for r in rows]
    return {
        "src": pad(src, S),
        "dec_in": pad(dec_in, T),
        "target": pad(target, T),
        "src_len": [len(r) for r in src],
        "tgt_len": [len(r) for r in dec_in],
    }


def sinusoidal_pe(max_len, d_model, dtype=torch.float64):
    """pe[pos, 2i] = sin(pos / 10000^(2i/C)), pe[pos, 2i+1] = cos(pos / 10000^(2i/C))."""
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / torch.pow(torch.tensor(10000.0, dtype=torch.float64), two_i / d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.to(dtype)


# --------------------------------------------------------------------------- model

class Stack(nn.Module):
    """Holds `layers` (ModuleList) and, with pre-norm, a final `norm`."""

    def __init__(self, layers, norm):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        if norm is not None:
            self.norm = norm
        else:
            self.norm = None


class Seq2Seq(nn.Module):
    def __init__(self, cfg, dtype):
        super().__init__()
        C, H, Fd = cfg["d_model"], cfg["heads"], cfg["ffn"]
        kw = dict(dtype=dtype)
        pre = cfg["norm"] == "pre"
        self.cfg = cfg
        self.src_embed = nn.Embedding(cfg["src_vocab"], C, padding_idx=PAD_ID, **kw)
        self.tgt_embed = nn.Embedding(cfg["tgt_vocab"], C, padding_idx=PAD_ID, **kw)
        self.generator = nn.Linear(C, cfg["tgt_vocab"], bias=False, **kw)
        if cfg["tie"] in ("decoder", "all"):
            self.generator.weight = self.tgt_embed.weight
        if cfg["tie"] == "all":
            assert cfg["src_vocab"] == cfg["tgt_vocab"]
            self.src_embed.weight = self.tgt_embed.weight
        enc = [nn.TransformerEncoderLayer(C, H, Fd, dropout=0.0, activation=cfg["activation"],
                                          layer_norm_eps=LN_EPS, batch_first=True,
                                          norm_first=pre, **kw)
               for _ in range(cfg["enc_layers"])]
        dec = [nn.TransformerDecoderLayer(C, H, Fd, dropout=0.0, activation=cfg["activation"],
                                          layer_norm_eps=LN_EPS, batch_first=True,
                                          norm_first=pre, **kw)
               for _ in range(cfg["dec_layers"])]
        self.encoder = Stack(enc, nn.LayerNorm(C, eps=LN_EPS, **kw) if pre else None)
        self.decoder = Stack(dec, nn.LayerNorm(C, eps=LN_EPS, **kw) if pre else None)
        self.register_buffer("pe", sinusoidal_pe(MAX_LEN, C, dtype), persistent=False)

    def all_params(self):
        """name -> Parameter for EVERY name, tied names included (they alias one tensor)."""
        return collections.OrderedDict(sorted(self.state_dict(keep_vars=True).items()))

    def embed(self, emb, ids):
        C = self.cfg["d_model"]
        return emb(ids) * math.sqrt(C) + self.pe[: ids.shape[1]]

    def forward(self, src, dec_in):
        T = dec_in.shape[1]
        src_pad = src == PAD_ID                     # True = key is ignored
        tgt_pad = dec_in == PAD_ID
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True = masked
        x = self.embed(self.src_embed, src)
        for layer in self.encoder.layers:
            x = layer(x, src_key_padding_mask=src_pad)
        if self.encoder.norm is not None:
            x = self.encoder.norm(x)
        memory = x
        y = self.embed(self.tgt_embed, dec_in)
        for layer in self.decoder.layers:
            y = layer(y, memory, tgt_mask=causal, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)
        if self.decoder.norm is not None:
            y = self.decoder.norm(y)
        return self.generator(y), memory, y


def init_params(model, seed):
    """Non-trivial random values for every parameter; float32-representable."""
    g = torch.Generator().manual_seed(seed)
    C = model.cfg["d_model"]
    params = model.all_params()
    aliases = collections.defaultdict(list)         # id(tensor) -> every name it has
    for name, p in params.items():
        aliases[id(p)].append(name)
    seen = set()
    with torch.no_grad():
        for name, p in params.items():
            if id(p) in seen:
                continue                            # tied alias, initialised once
            seen.add(id(p))
            is_embedding = any(n.endswith("embed.weight") for n in aliases[id(p)])
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("embed.weight") or name == "generator.weight":
                v = torch.randn(p.shape, generator=g, dtype=torch.float64) * C ** -0.5
            elif ".norm" in name and leaf == "weight":
                v = 1.0 + 0.5 * torch.randn(p.shape, generator=g, dtype=torch.float64)
            elif leaf == "weight" or leaf == "in_proj_weight":
                fan_out, fan_in = p.shape
                a = math.sqrt(6.0 / (fan_in + fan_out))      # Xavier-uniform bound
                v = (torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * a
            elif leaf in ("bias", "in_proj_bias"):
                v = (torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * 0.5
            else:
                raise ValueError("no init rule for " + name)
            if is_embedding:
                v[PAD_ID] = 0.0                     # as nn.Embedding(padding_idx=0) does
            p.copy_(v.float().to(p.dtype))          # round to float32 first


def label_smoothed_loss(logits, target):
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=PAD_ID,
                           label_smoothing=LABEL_SMOOTHING)
    nll = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=PAD_ID)
    return loss, nll


def run_model(model, batch):
    src = torch.tensor(batch["src"])
    dec_in = torch.tensor(batch["dec_in"])
    target = torch.tensor(batch["target"])
    model.train()                                   # dropout is 0; keeps PyTorch off the fast path
    for p in model.parameters():
        p.grad = None
    logits, memory, dec_out = model(src, dec_in)
    loss, nll = label_smoothed_loss(logits, target)
    loss.backward()
    grads = collections.OrderedDict(
        (n, p.grad.detach().clone()) for n, p in model.all_params().items())
    return dict(logits=logits.detach(), loss=loss.detach(), nll=nll.detach(),
                encoder_out=memory.detach(), decoder_out=dec_out.detach(), grads=grads)


# ------------------------------------------------- independent functional reference

def manual_forward(W, cfg, batch, gates=None):
    """Same model written out with plain tensor ops; documents the semantics.

    gates: optional dict "E.<layer>" / "D.<layer>" / "A.<layer>" -> (B, H, Lq, 1) tensor multiplying each
    head's output at each query position before the heads are merged (the head gate xi of tapeformer's
    attention, one per position, as `tapeformer heads` uses it)."""
    C, H = cfg["d_model"], cfg["heads"]
    dh = C // H
    pre = cfg["norm"] == "pre"
    act = F.relu if cfg["activation"] == "relu" else (lambda t: 0.5 * t * (1 + torch.erf(t / math.sqrt(2))))
    src = torch.tensor(batch["src"])
    dec_in = torch.tensor(batch["dec_in"])
    target = torch.tensor(batch["target"])
    B, S = src.shape
    T = dec_in.shape[1]
    pe = sinusoidal_pe(MAX_LEN, C)

    def embed(table, ids):
        keep = (ids != PAD_ID).to(table.dtype)[..., None]   # padding_idx: no grad to row 0
        return table[ids] * keep * math.sqrt(C) + pe[: ids.shape[1]]

    def ln(x, p):
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)        # biased variance
        return (x - mu) / torch.sqrt(var + LN_EPS) * W[p + ".weight"] + W[p + ".bias"]

    def lin(x, p):
        return x @ W[p + ".weight"].t() + W[p + ".bias"]

    def mha(xq, xkv, p, blocked, gate=None):                # blocked: (B, Lq, Lk) True = -inf
        Wi, bi = W[p + ".in_proj_weight"], W[p + ".in_proj_bias"]
        q = xq @ Wi[:C].t() + bi[:C]                        # rows [0,C) = q, [C,2C) = k, [2C,3C) = v
        k = xkv @ Wi[C:2 * C].t() + bi[C:2 * C]
        v = xkv @ Wi[2 * C:].t() + bi[2 * C:]
        split = lambda t: t.reshape(B, t.shape[1], H, dh).transpose(1, 2)   # head h = cols [h*dh, (h+1)*dh)
        q, k, v = split(q), split(k), split(v)
        s = (q / math.sqrt(dh)) @ k.transpose(-1, -2)
        s = s.masked_fill(blocked[:, None], float("-inf"))
        a = torch.softmax(s, -1)
        o = a @ v                                           # (B, H, Lq, dh): head h's output o_{b,h,t}
        if gate is not None:
            o = o * gate                                    # xi_{b,h,t} * o_{b,h,t}
        o = o.transpose(1, 2).reshape(B, xq.shape[1], C)
        return lin(o, p + ".out_proj")

    def ffn(x, p):
        return lin(act(lin(x, p + "linear1")), p + "linear2")

    src_pad = src == PAD_ID
    tgt_pad = dec_in == PAD_ID
    enc_block = src_pad[:, None, :].expand(B, S, S)
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    dec_block = causal[None] | tgt_pad[:, None, :]
    cross_block = src_pad[:, None, :].expand(B, T, S)

    g = (lambda key: None) if gates is None else gates.get
    x = embed(W["src_embed.weight"], src)
    for i in range(cfg["enc_layers"]):
        p = "encoder.layers.%d." % i
        if pre:
            x = x + mha(ln(x, p + "norm1"), ln(x, p + "norm1"), p + "self_attn", enc_block, g("E.%d" % i))
            x = x + ffn(ln(x, p + "norm2"), p)
        else:
            x = ln(x + mha(x, x, p + "self_attn", enc_block, g("E.%d" % i)), p + "norm1")
            x = ln(x + ffn(x, p), p + "norm2")
    if pre:
        x = ln(x, "encoder.norm")
    mem = x
    y = embed(W["tgt_embed.weight"], dec_in)
    for i in range(cfg["dec_layers"]):
        p = "decoder.layers.%d." % i
        if pre:
            h = ln(y, p + "norm1")
            y = y + mha(h, h, p + "self_attn", dec_block, g("D.%d" % i))
            y = y + mha(ln(y, p + "norm2"), mem, p + "multihead_attn", cross_block, g("A.%d" % i))
            y = y + ffn(ln(y, p + "norm3"), p)
        else:
            y = ln(y + mha(y, y, p + "self_attn", dec_block, g("D.%d" % i)), p + "norm1")
            y = ln(y + mha(y, mem, p + "multihead_attn", cross_block, g("A.%d" % i)), p + "norm2")
            y = ln(y + ffn(y, p), p + "norm3")
    if pre:
        y = ln(y, "decoder.norm")
    logits = y @ W["generator.weight"].t()

    V = logits.shape[-1]
    eps = LABEL_SMOOTHING
    logp = torch.log_softmax(logits, -1).reshape(-1, V)
    t = target.reshape(-1)
    keep = (t != PAD_ID).to(logp.dtype)
    nll_i = -logp.gather(1, t[:, None])[:, 0]
    smooth_i = -logp.mean(-1)                # uniform over ALL V classes, pad class included
    n = keep.sum()
    nll = (nll_i * keep).sum() / n
    loss = (1 - eps) * nll + eps * (smooth_i * keep).sum() / n
    return logits, mem, loss, nll


def manual_run(model, batch):
    """Run manual_forward on fresh leaves that alias exactly like the model's tied params."""
    leaves, W = {}, {}
    for n, p in model.all_params().items():
        if id(p) not in leaves:
            leaves[id(p)] = p.detach().clone().requires_grad_(True)
        W[n] = leaves[id(p)]
    logits, mem, loss, nll = manual_forward(W, model.cfg, batch)
    loss.backward()
    return dict(logits=logits.detach(), encoder_out=mem.detach(), loss=loss.detach(),
                nll=nll.detach(), grads={n: W[n].grad for n in W})


def head_study(model, batch):
    """What `tapeformer heads` reports, computed here from its definitions (Michel et al. 2019).

    Every attention gets a gate xi (B, H, Lq, 1) of ones; L is the NLL summed over the non-pad target
    tokens (no label smoothing); after L.backward() the gate gradient at (b, h, t) is <o_bht, dL/do_bht>.
    Returns name -> (H,) tensors: importance at token / sentence / batch granularity (raw, not normalised)
    and the L2 norms of each head's slices of the weight gradients."""
    cfg = model.cfg
    C, H = cfg["d_model"], cfg["heads"]
    dh = C // H
    src, dec_in = torch.tensor(batch["src"]), torch.tensor(batch["dec_in"])
    B, S = src.shape
    T = dec_in.shape[1]
    leaves, W = {}, {}
    for n, p in model.all_params().items():
        if id(p) not in leaves:
            leaves[id(p)] = p.detach().clone().requires_grad_(True)
        W[n] = leaves[id(p)]
    gates, queries = {}, {}
    for kind, layers in (("E", cfg["enc_layers"]), ("D", cfg["dec_layers"]), ("A", cfg["dec_layers"])):
        Lq = S if kind == "E" else T
        for i in range(layers):
            gates["%s.%d" % (kind, i)] = torch.ones(B, H, Lq, 1, dtype=torch.float64, requires_grad=True)
            queries["%s.%d" % (kind, i)] = (src if kind == "E" else dec_in) != PAD_ID   # (B, Lq) non-pad
    _, _, _, nll = manual_forward(W, cfg, batch, gates)
    n_tokens = (torch.tensor(batch["target"]) != PAD_ID).sum()
    (nll * n_tokens).backward()                      # the token-summed NLL
    out = collections.OrderedDict()
    for key, gate in gates.items():
        grad = gate.grad[..., 0] * queries[key][:, None, :]          # (B, H, Lq), pad queries zeroed
        n_q = queries[key].sum()
        out[key + ".importance_token"] = grad.abs().sum((0, 2)) / n_q
        out[key + ".importance_sentence"] = grad.sum(2).abs().sum(0) / B
        out[key + ".importance_batch"] = grad.sum((0, 2)).abs()
        kind, i = key.split(".")
        p = ("encoder.layers.%s.self_attn" if kind == "E" else
             "decoder.layers.%s.self_attn" if kind == "D" else "decoder.layers.%s.multihead_attn") % i
        gw, gb = W[p + ".in_proj_weight"].grad, W[p + ".in_proj_bias"].grad
        go = W[p + ".out_proj.weight"].grad
        rows = lambda t, base: torch.stack([t[base + h * dh: base + (h + 1) * dh].norm() for h in range(H)])
        out[key + ".grad_wq"], out[key + ".grad_wk"], out[key + ".grad_wv"] = rows(gw, 0), rows(gw, C), rows(gw, 2 * C)
        out[key + ".grad_bq"], out[key + ".grad_bv"] = rows(gb, 0), rows(gb, 2 * C)
        out[key + ".grad_wo"] = torch.stack([go[:, h * dh:(h + 1) * dh].norm() for h in range(H)])
        # The batch importance is the Frobenius product of W_o^h with its gradient (an identity the C++
        # tests check in float64); here, against the independent gate gradient.
        wo = W[p + ".out_proj.weight"].detach()
        frob = torch.stack([(wo[:, h * dh:(h + 1) * dh] * go[:, h * dh:(h + 1) * dh]).sum() for h in range(H)])
        assert torch.allclose(frob.abs(), out[key + ".importance_batch"], rtol=1e-10, atol=1e-12), key
    return {k: v.detach() for k, v in out.items()}


# ------------------------------------------------------------------ safetensors I/O

def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> torch tensor (stored float32, little-endian, in name order)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name].detach().cpu().to(torch.float32).numpy(),
                                   dtype="<f4")
        data = arr.tobytes()
        header[name] = {"dtype": "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata is not None:
        assert all(isinstance(v, str) for v in metadata.values())
        header["__metadata__"] = metadata
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out, end = collections.OrderedDict(), 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        h = header[name]
        b, e = h["data_offsets"]
        assert h["dtype"] == "F32" and b == end, name
        end = e
        arr = np.frombuffer(data[b:e], dtype="<f4").reshape(h["shape"])
        out[name] = torch.from_numpy(arr.copy())
    assert end == len(data)
    return out, meta


# ------------------------------------------------------------------------- checks

def rel_err(a, b):
    a, b = a.double(), b.double()
    denom = b.abs().max().item()
    return (a - b).abs().max().item() / (denom if denom > 0 else 1.0)


def check_close(tag, got, ref, tol):
    pairs = [("logits", got["logits"], ref["logits"]), ("loss", got["loss"], ref["loss"]),
             ("nll", got["nll"], ref["nll"]), ("encoder_out", got["encoder_out"], ref["encoder_out"])]
    pairs += [("grad." + n, got["grads"][n], ref["grads"][n]) for n in ref["grads"]]
    worst = max(pairs, key=lambda t: rel_err(t[1], t[2]))
    w = rel_err(worst[1], worst[2])
    if not w <= tol:
        sys.exit("%s: %s differs: rel err %.3g > %.3g" % (tag, worst[0], w, tol))
    return worst[0], w


def metadata_for(cfg):
    keys = ["src_vocab", "tgt_vocab", "d_model", "heads", "ffn", "enc_layers", "dec_layers",
            "norm", "activation", "tie"]
    meta = {k: str(cfg[k]) for k in keys}
    meta.update(pad_id=str(PAD_ID), bos_id=str(BOS_ID), eos_id=str(EOS_ID),
                positional="sinusoidal", max_len=str(MAX_LEN),
                label_smoothing=str(LABEL_SMOOTHING), layer_norm_eps=str(LN_EPS),
                seed=str(cfg["seed"]))
    return meta


def build(cfg, dtype):
    torch.manual_seed(cfg["seed"])       # module constructors draw from the global RNG
    return Seq2Seq(cfg, dtype)


def make_config(name, cfg, batch, out_dir):
    model = build(cfg, torch.float64)
    init_params(model, cfg["seed"])
    params = model.all_params()
    ref = run_model(model, batch)

    # 1. independent functional implementation
    man = manual_run(model, batch)
    check_close(name + " manual-vs-nn", man, ref, 1e-10)

    # tied names must really alias one tensor (and so get one gradient)
    if cfg["tie"] != "none":
        assert params["generator.weight"] is params["tgt_embed.weight"]
        assert torch.equal(ref["grads"]["generator.weight"], ref["grads"]["tgt_embed.weight"])
    if cfg["tie"] == "all":
        assert params["src_embed.weight"] is params["tgt_embed.weight"]

    os.makedirs(out_dir, exist_ok=True)
    wpath = os.path.join(out_dir, "weights.safetensors")
    write_safetensors(wpath, {n: p for n, p in params.items()}, metadata_for(cfg))

    outputs = collections.OrderedDict()
    outputs["logits"] = ref["logits"]
    outputs["loss"] = ref["loss"].reshape(1)
    outputs["nll"] = ref["nll"].reshape(1)
    outputs["encoder_out"] = ref["encoder_out"]
    outputs["decoder_out"] = ref["decoder_out"]
    for n, g in ref["grads"].items():
        outputs["grad." + n] = g
    write_safetensors(os.path.join(out_dir, "outputs.safetensors"), outputs)
    write_safetensors(os.path.join(out_dir, "heads.safetensors"), head_study(model, batch))
    with open(os.path.join(out_dir, "batch.json"), "w") as f:
        json.dump(batch, f, separators=(", ", ": "))
        f.write("\n")

    # 2. reload weights into a fresh model (float64) and re-run
    loaded, meta = read_safetensors(wpath)
    assert meta == metadata_for(cfg)
    assert list(loaded) == list(params)
    fresh = build({**cfg, **{k: int(v) if v.isdigit() else v for k, v in meta.items()
                             if k in cfg}}, torch.float64)
    with torch.no_grad():
        for n, p in fresh.all_params().items():
            p.copy_(loaded[n].double())
    for n in params:                                 # stored weights are exact
        assert torch.equal(fresh.all_params()[n], params[n].detach()), n
    again = run_model(fresh, batch)
    assert again["loss"].item() == ref["loss"].item(), (again["loss"].item(), ref["loss"].item())
    assert torch.equal(again["logits"], ref["logits"])

    # 3. the stored (float32) outputs, re-read, agree with the float64 reference
    stored, _ = read_safetensors(os.path.join(out_dir, "outputs.safetensors"))
    assert set(stored) == set(outputs)
    for n, t in outputs.items():
        assert rel_err(stored[n].reshape(t.shape), t) < 1e-6, n

    # 4. a float32 PyTorch run meets the tolerance the C++ tests use
    f32 = build(cfg, torch.float32)
    with torch.no_grad():
        for n, p in f32.all_params().items():
            p.copy_(loaded[n])
    r32 = run_model(f32, batch)
    worst_name, worst = check_close(name + " float32-vs-float64", r32, ref, TOLERANCE)

    min_grad = min(((g.abs().max().item(), n) for n, g in ref["grads"].items()))
    sizes = {f: os.path.getsize(os.path.join(out_dir, f))
             for f in ("weights.safetensors", "outputs.safetensors", "heads.safetensors", "batch.json")}
    print("%-17s loss %.9f  nll %.9f  params %d (unique %d)  float32 worst %.2e (%s)  "
          "smallest max|grad| %.2e (%s)  sizes %s"
          % (name, ref["loss"].item(), ref["nll"].item(), len(params),
             len({id(p) for p in params.values()}), worst, worst_name, min_grad[0], min_grad[1],
             sizes))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    args = ap.parse_args()
    torch.set_num_threads(1)
    batch = make_batch()
    for name in args.configs:
        make_config(name, CONFIGS[name], batch, os.path.join(args.out, name))


if __name__ == "__main__":
    main()
