// Exercise: one step of Adam.                      Check it with: tapeformer exercise check adam_step
//
// Adam (Kingma & Ba 2015) keeps two running averages per parameter, of the gradient and of its square:
//     m ← β1 · m + (1 − β1) · g
//     v ← β2 · v + (1 − β2) · g²
// and moves each parameter by the ratio of the two, corrected for their start at 0 (t counts steps from 1):
//     p ← p − lr / (1 − β1^t) · m / (√v / √(1 − β2^t) + ε)
// This is PyTorch's torch.optim.Adam (ε added after the bias correction of √v). Update p, m and v in place;
// the grader starts m and v at 0 and calls you with t = 1, 2, 3, ... as a training loop would.
//
// p, g, m and v hold n values each.

extern "C" void adam_step(double* p, const double* g, double* m, double* v, long n, long t, double lr, double beta1,
                          double beta2, double eps) {
    // Your code here.
    (void)p, (void)g, (void)m, (void)v, (void)n, (void)t, (void)lr, (void)beta1, (void)beta2, (void)eps;
}
