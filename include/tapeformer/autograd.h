// The tape: reverse-mode automatic differentiation as a Wengert list.
//
// While recording, every differentiable op appends one record (its name, inputs, output and a backward
// closure) to the tape. backward(loss) seeds d loss/d loss = 1 and walks the tape from the end to the
// start, each closure adding (+=) its contribution to its inputs' gradients. A tensor used twice thus
// gets the sum of both contributions. An input whose values were dropped after the forward pass
// (Tensor::drop_values) is computed again just before the first closure that reads it. Afterwards the tape
// is cleared (its vector keeps its capacity) and the intermediate tensors return their memory to the pool
// for the next step.
#pragma once
#include <functional>
#include <vector>

#include "tapeformer/tensor.h"

TF_NAMESPACE_BEGIN

// backward(output, inputs): read output.grad(), add into inputs[i].grad() for inputs that require grad.
using BackwardFn = std::function<void(Tensor& out, std::vector<Tensor>& in)>;

struct TapeRecord {
    const char* op;             // "matmul", "softmax", ...: for the tape view and error messages
    Tensor out;
    std::vector<Tensor> in;
    BackwardFn backward;        // empty for records kept only for display (reshape)
};

class Tape {
public:
    bool recording() const { return recording_; }
    void set_recording(bool on) { recording_ = on; }
    const std::vector<TapeRecord>& records() const { return records_; }
    void push(TapeRecord r) {
        records_.push_back(std::move(r));
        if (on_push_) on_push_(records_.back());
    }
    void clear() { records_.clear(); }  // keeps capacity: the next step appends without reallocating

    // Called right after each record is appended (empty: none): a profiler times the forward pass op by
    // op, charging each record the time since the previous one (bench.cpp).
    void set_push_hook(std::function<void(const TapeRecord&)> hook) { on_push_ = std::move(hook); }

private:
    std::vector<TapeRecord> records_;
    bool recording_ = true;
    std::function<void(const TapeRecord&)> on_push_;
};

Tape& tape();  // the current thread's tape

// True when an op on these inputs must be recorded: recording is on and some input requires grad.
bool needs_grad(std::initializer_list<const Tensor*> inputs);

// Called by an op after computing `out`: marks it as requiring grad and appends the record. Returns out.
Tensor record(const char* op, Tensor out, std::vector<Tensor> in, BackwardFn backward);

// Called by backward() right after each record's closure has run, before the record is freed: a profiler
// times the gaps between calls (see bench.cpp). Records without a closure or a gradient are not reported.
using RecordHook = std::function<void(const TapeRecord& record)>;

// Reverse pass from a scalar loss (seed 1), or from any tensor with a given upstream gradient of its
// shape (used by gradient checks). Clears the tape afterwards unless keep_tape is set.
void backward(Tensor& loss, bool keep_tape = false, const RecordHook& after_record = {});
void backward(Tensor& out, const std::vector<real>& upstream, bool keep_tape = false,
              const RecordHook& after_record = {});

// Within its scope nothing is recorded (evaluation, decoding, finite differences).
class NoGradGuard {
public:
    NoGradGuard() : previous_(tape().recording()) { tape().set_recording(false); }
    ~NoGradGuard() { tape().set_recording(previous_); }
    NoGradGuard(const NoGradGuard&) = delete;
    NoGradGuard& operator=(const NoGradGuard&) = delete;

private:
    bool previous_;
};

TF_NAMESPACE_END
