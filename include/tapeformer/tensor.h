// Tensor: a dense, contiguous, row-major array of `real` with up to four dimensions (B, H, T, D),
// plus what autograd needs: a gradient buffer of the same size and a flag saying whether ops on it
// are recorded. A Tensor is a cheap handle (a shared pointer to its storage); copying it aliases.
#pragma once
#include <array>
#include <cstddef>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "tapeformer/config.h"

TF_NAMESPACE_BEGIN

// Up to four extents; rank 0 is a scalar with one element.
struct Shape {
    static constexpr int kMaxRank = 4;
    std::array<std::int64_t, kMaxRank> dims{};
    int rank = 0;

    Shape() = default;
    Shape(std::initializer_list<std::int64_t> d);
    static Shape of(const std::vector<std::int64_t>& d);

    std::int64_t numel() const;
    // d[i]; negative i counts from the end, as in PyTorch.
    std::int64_t operator[](int i) const;
    std::int64_t& operator[](int i);
    std::int64_t last() const { return rank ? dims[rank - 1] : 1; }
    // All but the last dimension multiplied: how many vectors a last-axis op (softmax, layer norm, a
    // linear layer) works on. Not to be confused with Tensor::rows(begin, end), a slice of the first axis.
    std::int64_t leading() const { return rank ? numel() / last() : 1; }
    bool operator==(const Shape& o) const;
    bool operator!=(const Shape& o) const { return !(*this == o); }
    std::string str() const;  // "(2, 3, 4)"
};

// Memory behind one or more Tensor views. Buffers come from a caching pool (see pool.h), so a training
// step re-uses the previous step's memory instead of asking the system allocator again.
struct Storage {
    real* data = nullptr;
    real* grad = nullptr;       // allocated on first use
    bool grad_stale = false;    // zero_grad ran: the buffer's values are to be read as zeros
    std::size_t size = 0;
    bool requires_grad = false;
    bool is_leaf = true;        // created by the user, not by an op: keeps .grad after backward
    bool shape_only = false;    // made inside a ShapeOnly scope: no values (data is null)
    // Values given back to the pool while the tensor lives on (Tensor::drop_values): data is null, and
    // `recompute` (when set) writes all `size` values again on the next read.
    bool values_dropped = false;
    std::function<void(real* values)> recompute;
    explicit Storage(std::size_t n);
    Storage(std::size_t n, bool shape_only);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;
};

// Where a backward writes one operand's gradient (Tensor::grad_target): the buffer, and whether it holds
// no gradient yet. Then the op writes its values (=, gemm's β = 0) instead of adding them (+=, β = 1), and
// the buffer was never zeroed: that saves a pass over every activation's gradient.
struct GradTarget {
    real* data;
    bool overwrite;
    real beta() const { return overwrite ? real(0) : real(1); }
};

// Inside a ShapeOnly scope (PyTorch's meta device) new tensors hold a shape and no values: data() is null,
// and filling them (Tensor::full, the initialisers of linear.h) does nothing. A model built inside one
// allocates nothing, yet its parameters have the real model's names and shapes: that is how
// ModelConfig::parameter_count and parameter_shapes read the model's structure off its constructors.
class ShapeOnly {
public:
    ShapeOnly();
    ~ShapeOnly();
    ShapeOnly(const ShapeOnly&) = delete;
    ShapeOnly& operator=(const ShapeOnly&) = delete;
    static bool active();  // on this thread

private:
    bool was_;
};

class Tensor {
public:
    Tensor() = default;  // an undefined tensor (defined() == false)

    static Tensor empty(const Shape& shape);                 // uninitialised values
    static Tensor zeros(const Shape& shape);
    static Tensor full(const Shape& shape, real value);
    static Tensor from(const std::vector<real>& values, const Shape& shape);
    static Tensor scalar(real value) { return full(Shape{}, value); }

    bool defined() const { return storage_ != nullptr; }
    bool shape_only() const { return storage_ && storage_->shape_only; }  // made inside a ShapeOnly scope
    const Shape& shape() const { return shape_; }
    std::int64_t size(int i) const { return shape_[i]; }
    int rank() const { return shape_.rank; }
    std::int64_t numel() const { return shape_.numel(); }

    real* data() { return storage_->data ? storage_->data + offset_ : values_elsewhere(); }
    const real* data() const { return storage_->data ? storage_->data + offset_ : values_elsewhere(); }
    real item() const;                      // the value of a one-element tensor
    std::vector<real> to_vector() const;

    // Autograd state.
    bool requires_grad() const { return storage_ && storage_->requires_grad; }
    Tensor& set_requires_grad(bool on = true);
    bool has_grad() const { return storage_ && storage_->grad; }
    real* grad();                           // the gradient buffer to add to, allocated and zeroed on first use
    const real* grad() const;               // nullptr when no gradient has been accumulated
    std::vector<real> grad_vector() const;  // a copy (zeros when none)
    // For a backward that gives every value of this view's gradient a contribution: see GradTarget. Only
    // a view of its whole storage can be overwritten; another (a rows() view) is zeroed and added to.
    GradTarget grad_target();
    // For a backward that computes the whole gradient from the values alone, element by element, when
    // nothing reads the values afterwards: the value buffer becomes the gradient buffer, and data() is
    // null from then on. Refused (a target with data == nullptr) unless this is an op's output (not a
    // leaf), seen whole, with no gradient given to it yet, and no tensor but those of the two tape records
    // that use it (the op that made it, the op whose backward this is) refers to its storage.
    GradTarget grad_over_value();
    void zero_grad();                       // the gradient reads as zeros again; keeps the buffer
    void release_grad();                    // no gradient any more: the buffer goes back to the pool (a view
                                            // of part of its storage only zeroes its part, as zero_grad)
    // Activation memory: an op's output that backward needs, but that can be computed again cheaply from what
    // backward keeps anyway, need not stay in memory from the forward pass to the backward one (PyTorch's
    // activation checkpointing, one tensor at a time). recompute_with says how to compute the whole storage's
    // values again; drop_values gives the value buffer back to the pool (the gradient is untouched). The next
    // read of data() then computes the values again into a fresh buffer when the storage knows how, and throws
    // std::logic_error when it does not (values dropped because nothing was going to read them).
    void recompute_with(std::function<void(real* values)> fill);
    bool recomputable() const { return storage_ && storage_->recompute != nullptr; }
    void drop_values();
    bool values_dropped() const { return storage_ && storage_->values_dropped; }
    bool is_leaf() const { return storage_->is_leaf; }
    void mark_non_leaf() { storage_->is_leaf = false; }

    // A view with another shape over the same values and gradient (no copy, nothing recorded).
    // One extent may be -1 and is inferred. Throws when the element counts differ.
    Tensor reshape(const Shape& shape) const;
    // A view of rows [begin, end) of the first axis (contiguous, so no copy): the value and gradient of
    // each row are those of this tensor. Used to take W_q, W_k, W_v out of the fused (3C, C) projection.
    Tensor rows(std::int64_t begin, std::int64_t end) const;
    // A deep copy of values (no gradient, not recorded).
    Tensor clone() const;

    bool same_storage(const Tensor& o) const { return storage_ == o.storage_; }

private:
    std::shared_ptr<Storage> storage_;
    real* values_elsewhere() const;  // data() when data is null: none (shape-only), or dropped ones
    Shape shape_;
    std::int64_t offset_ = 0;  // first element of this view inside the storage
};

TF_NAMESPACE_END
