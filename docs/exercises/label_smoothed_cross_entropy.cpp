// Exercise: label-smoothed cross-entropy.   Check it with: tapeformer exercise check label_smoothed_cross_entropy
//
// The training loss of "Attention Is All You Need" (§5.4, ε = 0.1), as PyTorch's F.cross_entropy computes it
// with label_smoothing = ε and mean reduction. For each row i of logits with p_i = softmax(logits_i):
//     loss_i = (1 − ε) · (−log p_i[t_i]) + ε/V · Σ_j (−log p_i[j])
// A row whose target t_i equals ignore_index (padding) counts for nothing; the loss is the mean of loss_i
// over the n' rows that count (0 when none does). Return the loss and write dlogits = ∂loss/∂logits:
// every element, 0 in the ignored rows.
// Hint: write loss_i as Σ_j q_i[j] · (−log p_i[j]) with a smoothed target q_i, and −log p_i[j] as
// logsumexp(logits_i) − logits_i[j]. Logits can be large: take the row's maximum out before exp.
//
// logits and dlogits are (n, V), row after row: element (i, j) is at i * V + j. The grader fills dlogits with
// NaN first, so a forgotten element shows.

extern "C" double label_smoothed_cross_entropy(const double* logits, const int* target, long n, long V, int ignore_index,
                                               double epsilon, double* dlogits) {
    // Your code here.
    (void)logits, (void)target, (void)n, (void)V, (void)ignore_index, (void)epsilon, (void)dlogits;
    return 0;
}
