// Exercise: LayerNorm backward.                   Check it with: tapeformer exercise check layer_norm_backward
//
// LayerNorm normalises each row of n values, then scales and shifts every column:
//     mu = mean of the row,  var = mean of (x − mu)²   (the biased variance)
//     x_hat = (x − mu) / sqrt(var + eps)
//     y = gamma * x_hat + beta                          (gamma, beta: one value per column)
// Backward gets x, gamma, eps and dy = ∂L/∂y and must produce
//     dx     = ∂L/∂x      (rows, n)
//     dgamma = ∂L/∂gamma  (n): summed over the rows
//     dbeta  = ∂L/∂beta   (n): summed over the rows
// Hint: x_hat depends on every x of its row through mu and var; docs/lesson-layer-norm-backward.md derives
// the result term by term, once you have tried.
//
// x, dy and dx are (rows, n), row after row: element (r, j) is at r * n + j. Write every element of dx,
// dgamma and dbeta (the grader fills them with NaN first, so a forgotten element shows).

extern "C" void layer_norm_backward(const double* x, const double* gamma, const double* dy, double eps, double* dx,
                                    double* dgamma, double* dbeta, long rows, long n) {
    // Your code here.
    (void)x, (void)gamma, (void)dy, (void)eps, (void)dx, (void)dgamma, (void)dbeta, (void)rows, (void)n;
}
