#!/usr/bin/env python3
"""Michel et al.'s pruning curve (2019, figure 3) from Python, cell by cell as in a notebook.

    PYTHONPATH=build/python python3 docs/python_pruning.py runs/toy data/toy

The same curve as `tapeformer heads prune --model runs/toy --src data/toy/test.src --ref data/toy/test.tgt
--imp-src data/toy/valid.src --imp-tgt data/toy/valid.tgt --step 10%`: the test suite runs this script
and compares its numbers with the command's (tests/python/test_api.py). Prints one JSON line per point.
"""
import json
import math
import sys

import tapeformer

# %% Load the model and the pairs: importance is measured on one set, quality on another.
model_dir, data = sys.argv[1], sys.argv[2]
model = tapeformer.load(model_dir)


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


imp_src, imp_tgt = lines(f"{data}/valid.src"), lines(f"{data}/valid.tgt")
test_src, test_ref = lines(f"{data}/test.src"), lines(f"{data}/test.tgt")

# %% Rank every head, least important first: importance normalised per layer, ranked jointly (Michel et al.).
heads = model.heads(imp_src, imp_tgt)  # a dict per head, as heads.json
ranking = [h["head"] for h in sorted(heads, key=lambda h: h["importance"])]  # sorted() is stable: ties keep E, D, A order


# %% Mask 10% more of the heads at each step; score BLEU (greedy) and NLL per token on the test pairs.
def score(masked):
    model.mask_heads(masked)
    bleu = tapeformer.bleu(model.translate(test_src), test_ref)
    return {"fraction": len(masked) / len(ranking), "bleu": bleu, "nll": model.nll(test_src, test_ref), "masked": masked}


step = 0.1
print(json.dumps(score([])), flush=True)
masked, k = 0, 1
while masked < len(ranking):
    count = min(len(ranking), math.ceil(k * step * len(ranking) - 1e-9))
    k += 1
    if count > masked:  # with fewer heads than steps, a step may round to the last one's count
        masked = count
        print(json.dumps(score(ranking[:count])), flush=True)
model.mask_heads([])

# %% With matplotlib installed, the curve:
#   import matplotlib.pyplot as plt
#   points = [json.loads(line) for line in output]
#   plt.plot([p["fraction"] for p in points], [p["bleu"] for p in points], marker="o")
