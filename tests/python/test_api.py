#!/usr/bin/env python3
"""The Python module against the CLI (ctest: python_api; docs/python.md).

    test_api.py CLI SOURCE_DIR

Trains a tiny model with the CLI, then checks that the module gives the CLI's numbers: the head study
equals `heads`' heads.json, the attention weights equal `attention --json`, a pair's gate gradients equal
its line of `heads --per-sentence`, translations equal `translate`'s, the pruning example of docs/ equals
`heads prune`; that errors are Python exceptions with the CLI's messages; and that the GIL is released
while the model computes. Exits non-zero, naming the check, when one fails.
"""
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import tapeformer

cli, source_dir = sys.argv[1], sys.argv[2]
toy = os.path.join(source_dir, "data", "toy")
tmp = tempfile.mkdtemp(prefix="tf_python_")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAILED:", what, file=sys.stderr)


def run(*args):
    return subprocess.run([cli, "--threads", "1", *args], capture_output=True, text=True)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# A 1+1-layer model, C 16, 2 heads (E, D, A: 6 heads), trained for a few steps.
model_dir = os.path.join(tmp, "model")
trained = run("train", "--train-src", f"{toy}/valid.src", "--train-tgt", f"{toy}/valid.tgt", "--tokenizer", "word",
              "--vocab-size", "0", "--d-model", "16", "--heads", "2", "--ffn", "32", "--layers", "1",
              "--max-steps", "20", "--out", model_dir)
assert trained.returncode == 0, trained.stderr

tapeformer.set_threads(1)
model = tapeformer.load(model_dir)
check(model.config["heads"] == 2 and model.config["d_model"] == 16, "config: the model's settings")
src, tgt = lines(f"{toy}/valid.src")[:200], lines(f"{toy}/valid.tgt")[:200]
with open(os.path.join(tmp, "s.src"), "w", encoding="utf-8") as f:
    f.write("\n".join(src) + "\n")
with open(os.path.join(tmp, "s.tgt"), "w", encoding="utf-8") as f:
    f.write("\n".join(tgt) + "\n")

# The head study: the same numbers as heads.json, masked heads included.
model.mask_heads(["A:0:1"])
heads = model.heads(src, tgt)
model.mask_heads([])
study = run("heads", "--model", model_dir, "--src", f"{tmp}/s.src", "--tgt", f"{tmp}/s.tgt", "--out", f"{tmp}/heads",
            "--mask-heads", "A:0:1")
assert study.returncode == 0, study.stderr
with open(f"{tmp}/heads/heads.json", encoding="utf-8") as f:
    cli_heads = json.load(f)["heads"]
check(heads == cli_heads, "heads: every entry equals heads.json's")
check([h["head"] for h in heads if h["masked"]] == ["A:0:1"], "heads: the masked head is marked")

# forward: weights equal `attention --json`, the pair's gate gradients its line of heads_per_sentence.jsonl.
pair = 3
out = model.forward(src[pair], tgt[pair])
maps = run("attention", "--model", model_dir, "--src", src[pair], "--tgt", tgt[pair], "--json", f"{tmp}/att.json")
assert maps.returncode == 0, maps.stderr
with open(f"{tmp}/att.json", encoding="utf-8") as f:
    att = json.load(f)
check(out["tokens"]["src"] == att["tokens"]["src"] and out["tokens"]["tgt_in"] == att["tokens"]["tgt_in"], "forward: tokens")
for kind, name in (("E", "encoder_self"), ("D", "decoder_self"), ("A", "cross")):
    for layer, weights in enumerate(out["weights"][kind]):
        check(weights.dtype == np.float32 and weights.shape == np.array(att[name][layer]).shape, f"forward: {kind} {layer} shape")
        check(np.array_equal(weights, np.array(att[name][layer], dtype=np.float32)), f"forward: {kind} layer {layer} weights")
unmasked = run("heads", "--model", model_dir, "--src", f"{tmp}/s.src", "--tgt", f"{tmp}/s.tgt", "--out", f"{tmp}/all",
               "--per-sentence")
assert unmasked.returncode == 0, unmasked.stderr
per_sentence = [json.loads(line) for line in lines(f"{tmp}/all/heads_per_sentence.jsonl")]
check(len(per_sentence) == len(src), "per-sentence: a line per pair")
row = per_sentence[pair]
for entry in row["heads"]:
    kind, layer, head = entry["head"].split(":")
    g = out["gate_grad"][kind][int(layer)][int(head)]
    # the CLI's pair sat in a batch with others; the module's pass has it alone: float rounding apart
    scale = max(1e-12, float(np.max(np.abs(g))))
    check(np.max(np.abs(g - np.array(entry["gate_grad"]))) <= 1e-5 * scale, f"forward: gate gradients of {entry['head']}")
    check(abs(out["importance"][kind][int(layer)][int(head)] - entry["importance_token"]) <= 1e-5 * scale,
          f"forward: importance of {entry['head']}")
check(out["context"]["E"][0].shape == (2, len(out["tokens"]["src"]), 8), "forward: context (H, Tq, D)")
check(set(model.forward(src[0], tgt[0], probes=["weights"]).keys()) == {"tokens", "loss", "weights"}, "forward: only the probes asked for")

# Decoding: greedy and beam equal `translate`.
for beam in (1, 3):
    translated = run("translate", "--model", model_dir, "--input", f"{tmp}/s.src", "--beam", str(beam))
    assert translated.returncode == 0, translated.stderr
    check(model.translate(src, beam=beam) == translated.stdout.splitlines(), f"translate: beam {beam}")

# Errors: Python exceptions carrying the CLI's one line.
cli_error = run("translate", "--model", f"{tmp}/none", "--input", f"{tmp}/s.src").stderr.strip()
try:
    tapeformer.load(f"{tmp}/none")
    check(False, "errors: loading a missing directory raises")
except RuntimeError as e:
    check(cli_error.endswith(str(e)), f"errors: the CLI's message ({cli_error!r} against {str(e)!r})")
try:
    model.mask_heads(["E:3:0"])
    check(False, "errors: a head the model lacks raises")
except ValueError as e:
    check("E:3:0" in str(e), "errors: the head is named")

# The GIL is released while the model computes: another Python thread keeps running meanwhile. It notes
# the longest time it went without running; held through the study, that would be the study's whole time.
all_src, all_tgt = 3 * lines(f"{toy}/valid.src"), 3 * lines(f"{toy}/valid.tgt")  # a study of a few tenths of a second
done = threading.Event()
spin = {"last": time.perf_counter(), "longest": 0.0}


def spinner():
    while not done.is_set():
        now = time.perf_counter()
        spin["longest"] = max(spin["longest"], now - spin["last"])
        spin["last"] = now


thread = threading.Thread(target=spinner)
thread.start()
time.sleep(0.05)  # the spinner is running
spin["longest"] = 0.0
start = time.perf_counter()
model.heads(all_src, all_tgt)
took = time.perf_counter() - start
done.set()
thread.join()
check(spin["longest"] < took / 2,
      f"GIL: another thread went {spin['longest']:.3f} s without running during a {took:.3f} s study")

# The notebook example of docs/ gives `heads prune`'s curve.
example = subprocess.run([sys.executable, os.path.join(source_dir, "docs", "python_pruning.py"), model_dir, toy],
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
assert example.returncode == 0, example.stderr
points = [json.loads(line) for line in example.stdout.splitlines()]
pruned = run("heads", "prune", "--model", model_dir, "--src", f"{toy}/test.src", "--ref", f"{toy}/test.tgt",
             "--imp-src", f"{toy}/valid.src", "--imp-tgt", f"{toy}/valid.tgt", "--step", "10%", "--json", f"{tmp}/prune.json")
assert pruned.returncode == 0, pruned.stderr
with open(f"{tmp}/prune.json", encoding="utf-8") as f:
    curve = json.load(f)["models"][0]["curve"]
check(len(points) == len(curve) == 7, f"pruning: 7 points (0..6 of 6 heads), got {len(points)} and {len(curve)}")
for p, c in zip(points, curve):
    check(p["masked"] == c["masked"], f"pruning: heads masked at {c['fraction']:.2f}")
    check(p["bleu"] == c["bleu"] and p["nll"] == c["nll"], f"pruning: BLEU and NLL at {c['fraction']:.2f}")

if failures:
    sys.exit(f"{len(failures)} check(s) failed: " + "; ".join(failures))
print("python_api: every check passed")
