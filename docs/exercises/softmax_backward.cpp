// Exercise: softmax backward.                     Check it with: tapeformer exercise check softmax_backward
//
// A row softmax turns scores x into probabilities y:
//     y_j = exp(x_j) / Σ_k exp(x_k)
// Backward gets y (the forward's output) and dy = ∂L/∂y, and must produce dx = ∂L/∂x for every element.
// Derive it from ∂y_j/∂x_i = y_j (δ_ij − y_i) — docs/lesson-autograd-and-the-tape.md and the softmax op
// in src/ops.cpp are where to look once you have tried.
//
// y, dy and dx are (rows, n), row after row: element (r, j) is at r * n + j. Each row is its own softmax.
// Write every element of dx (the grader fills it with NaN first, so a forgotten element shows).

extern "C" void softmax_backward(const double* y, const double* dy, double* dx, long rows, long n) {
    // Your code here.
    (void)y, (void)dy, (void)dx, (void)rows, (void)n;
}
