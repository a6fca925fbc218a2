// Exercise: sinusoidal positional encoding.       Check it with: tapeformer exercise check sinusoidal_positions
//
// "Attention Is All You Need", section 3.5: the model learns no order of its own, so each position gets a
// fixed vector added to its embedding:
//     PE[pos, 2i]     = sin(pos / 10000^(2i / C))
//     PE[pos, 2i + 1] = cos(pos / 10000^(2i / C))
// for pos = 0 .. positions − 1 and column pairs (2i, 2i + 1) of the C columns. When C is odd the last
// column is a sine with no cosine after it.
//
// pe is (positions, C), row after row: PE[pos, c] is at pos * C + c. Write every element (the grader fills
// pe with NaN first, so a forgotten element shows).

extern "C" void sinusoidal_positions(double* pe, long positions, long C) {
    // Your code here.
    (void)pe, (void)positions, (void)C;
}
