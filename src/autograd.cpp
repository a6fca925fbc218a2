// The tape and the reverse pass. See autograd.h; the whole engine is the fifty lines below.
#include "tapeformer/autograd.h"

#include <stdexcept>

TF_NAMESPACE_BEGIN

Tape& tape() {
    thread_local Tape t;
    return t;
}

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
    if (!tape().recording()) return false;
    for (const Tensor* t : inputs)
        if (t && t->defined() && t->requires_grad()) return true;
    return false;
}

Tensor record(const char* op, Tensor out, std::vector<Tensor> in, BackwardFn backward) {
    out.set_requires_grad(true);
    out.mark_non_leaf();
    tape().push(TapeRecord{op, out, std::move(in), std::move(backward)});
    return out;
}

void backward(Tensor& out, const std::vector<real>& upstream, bool keep_tape, const RecordHook& after_record) {
    if (static_cast<std::int64_t>(upstream.size()) != out.numel())
        throw std::invalid_argument("backward: upstream gradient has " + std::to_string(upstream.size()) +
                                    " values, output " + out.shape().str() + " has " + std::to_string(out.numel()));
    if (!out.requires_grad())
        throw std::invalid_argument("backward: the output does not depend on any tensor that requires grad");
    real* g = out.grad();
    for (std::size_t i = 0; i < upstream.size(); ++i) g[i] += upstream[i];
    // Reverse walk. Records are appended in execution order, which is a topological order, so when a
    // record's backward runs, every use of its output (recorded later) has already added its gradient.
    // Once its backward has run, a record is done with: dropping its references right away frees each
    // activation and its gradient (unless something else holds them) while the walk goes on, so they are
    // not all alive at once at the end of the pass.
    auto& records = tape().records();
    for (auto it = records.rbegin(); it != records.rend(); ++it) {
        TapeRecord& r = const_cast<TapeRecord&>(*it);
        if (r.backward && r.out.has_grad()) {
            // Inputs whose values were dropped after the forward (Tensor::drop_values) are computed again
            // here, before the closure reads them, perhaps from several threads.
            for (Tensor& t : r.in)
                if (t.values_dropped() && t.recomputable()) t.data();
            r.backward(r.out, r.in);
            if (after_record) after_record(r);
        }
        if (!keep_tape) r = TapeRecord{r.op, Tensor(), {}, nullptr};
    }
    if (!keep_tape) tape().clear();
}

void backward(Tensor& loss, bool keep_tape, const RecordHook& after_record) {
    if (loss.numel() != 1)
        throw std::invalid_argument("backward: the loss must be a single value, got shape " + loss.shape().str() +
                                    " (pass an upstream gradient for other outputs)");
    backward(loss, std::vector<real>{real(1)}, keep_tape, after_record);
}

TF_NAMESPACE_END
