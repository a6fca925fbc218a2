#!/usr/bin/python3
"""Reproduce the optimizer trajectories in tests/test_optim.cpp with torch.optim, in float64.

Usage:
    /usr/bin/python3 tests/golden/make_optim_trajectories.py            # print them, C++-ready
    /usr/bin/python3 tests/golden/make_optim_trajectories.py --check    # compare with tests/test_optim.cpp

Every trajectory starts from p0 = (0.5, -1, 2) and takes three steps with the fixed gradients of the C++
test (kP0, kGrads), all in float64: the expected values are torch.optim's update of the decimal numbers,
which the float32 C++ optimizers must follow within the test's margin (1e-6). --check reads the test file, finds each case by the text of its
TEST_CASE / SECTION, and requires every expected number there to equal torch's to the last digit
(relative difference <= 1e-15); it exits with status 1 otherwise.

Only torch (Debian's python3-torch 1.13) and the standard library are needed.
"""

import argparse
import os
import re
import sys

import torch

torch.set_default_dtype(torch.float64)

P0 = [0.5, -1.0, 2.0]
GRADS = [[0.1, -0.2, 0.3], [-0.05, 0.4, 0.0], [0.2, 0.1, -0.3]]


# name: (text that identifies the case in test_optim.cpp, optimizer factory, lr, gradient scale)
CASES = [
    ("adam_l2", 'TEST_CASE("Adam (L2 weight decay) follows torch.optim.Adam',
     lambda p: torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.1), 0.01, 1.0),
    ("adamw", 'TEST_CASE("AdamW (decoupled weight decay)',
     lambda p: torch.optim.AdamW([p], lr=0.01, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.1), 0.01, 1.0),
    ("adam_torch_defaults", 'TEST_CASE("Adam with PyTorch\'s default betas',
     lambda p: torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.999), eps=1e-8), 0.01, 1.0),
    ("adam_eps_placement", 'TEST_CASE("Adam adds eps after the bias-corrected',
     lambda p: torch.optim.Adam([p], lr=0.01, betas=(0.9, 0.98), eps=1e-3), 0.01, 0.01),
    ("sgd_momentum_wd", 'TEST_CASE("SGD with momentum and weight decay',
     lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, weight_decay=0.01), 0.1, 1.0),
    ("sgd_plain", 'SECTION("plain',
     lambda p: torch.optim.SGD([p], lr=0.1), 0.1, 1.0),
    ("sgd_nesterov", 'SECTION("Nesterov',
     lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.9, nesterov=True), 0.1, 1.0),
    ("sgd_dampening", 'SECTION("μ = 0.5, dampening 0.3',
     lambda p: torch.optim.SGD([p], lr=0.1, momentum=0.5, dampening=0.3), 0.1, 1.0),
]


def trajectory(make, grad_scale):
    """p after each of the three steps, and the optimizer's state after the last."""
    p = torch.tensor(P0, requires_grad=True)
    opt = make(p)
    out = []
    for g in GRADS:
        p.grad = torch.tensor([x * grad_scale for x in g])
        opt.step()
        out.append(p.detach().tolist())
    return out, opt.state[p]


def numbers_in(text):
    return [float(x) for x in re.findall(r"-?\d+\.\d+(?:e-?\d+)?", text)]


def expected_in_test(source, marker):
    """The three-element lists `check_close(traj[i], {...}` and the Adam moments after `marker`."""
    start = source.index(marker)
    end = len(source)
    for stop in ('\nTEST_CASE(', '\n    SECTION('):
        nxt = source.find(stop, start + len(marker))
        if nxt != -1:
            end = min(end, nxt)
    case = source[start:end]
    traj = [numbers_in(m) for m in re.findall(r"check_close\(traj\[\d\], \{([^}]*)\}", case)]
    moments = {name: numbers_in(m) for name, m in
               re.findall(r"check_close\(state\[(\d)\]\.tensor\.to_vector\(\), \{([^}]*)\}", case)}
    return traj, moments


def same(a, b):
    return all(x == y or abs(x - y) <= 1e-15 * max(abs(x), abs(y)) for x, y in zip(a, b)) and len(a) == len(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="compare with the numbers in tests/test_optim.cpp")
    ap.add_argument("--test", default=os.path.join(os.path.dirname(__file__), "..", "test_optim.cpp"))
    args = ap.parse_args()
    source = open(args.test, encoding="utf-8").read() if args.check else ""

    failures = 0
    print(f"torch {torch.__version__}, float64")
    for name, marker, make, lr, grad_scale in CASES:
        traj, state = trajectory(make, grad_scale)
        print(f"{name}:")
        for i, p in enumerate(traj):
            print(f"    check_close(traj[{i}], {{{', '.join(repr(x) for x in p)}}}, kMargin);")
        moments = {}
        if "exp_avg" in state:
            moments = {"1": state["exp_avg"].tolist(), "2": state["exp_avg_sq"].tolist()}
            for k, v in moments.items():
                print(f"    state[{k}] ({'m' if k == '1' else 'v'}): {{{', '.join(repr(x) for x in v)}}}")
        if not args.check:
            continue
        want_traj, want_moments = expected_in_test(source, marker)
        if len(want_traj) != 3:
            print(f"  FAIL: found {len(want_traj)} trajectory lines for {marker!r} in {args.test}")
            failures += 1
        for i, (got, want) in enumerate(zip(traj, want_traj)):
            if not same(got, want):
                print(f"  FAIL traj[{i}]: torch {got}, test {want}")
                failures += 1
        for k, want in want_moments.items():
            if not same(moments.get(k, []), want):
                print(f"  FAIL state[{k}]: torch {moments.get(k)}, test {want}")
                failures += 1
    if args.check:
        print("all trajectories match torch.optim" if failures == 0 else f"{failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
