// Tensor storage, shapes and views. The numerics live in ops.cpp; this file only manages memory.
#include "tapeformer/tensor.h"

#include <cstring>
#include <stdexcept>

#include "tapeformer/pool.h"

TF_NAMESPACE_BEGIN

Shape::Shape(std::initializer_list<std::int64_t> d) {
    if (d.size() > kMaxRank)
        throw std::invalid_argument("Shape: at most " + std::to_string(kMaxRank) + " dimensions, got " +
                                    std::to_string(d.size()));
    for (std::int64_t x : d) dims[rank++] = x;
}

Shape Shape::of(const std::vector<std::int64_t>& d) {
    if (d.size() > kMaxRank)
        throw std::invalid_argument("Shape: at most " + std::to_string(kMaxRank) + " dimensions, got " +
                                    std::to_string(d.size()));
    Shape s;
    for (std::int64_t x : d) s.dims[s.rank++] = x;
    return s;
}

std::int64_t Shape::numel() const {
    std::int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
}

static int axis_index(int i, int rank) {
    int a = i < 0 ? i + rank : i;
    if (a < 0 || a >= rank)
        throw std::invalid_argument("Shape: axis " + std::to_string(i) + " out of range for rank " +
                                    std::to_string(rank));
    return a;
}

std::int64_t Shape::operator[](int i) const { return dims[axis_index(i, rank)]; }
std::int64_t& Shape::operator[](int i) { return dims[axis_index(i, rank)]; }

bool Shape::operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
        if (dims[i] != o.dims[i]) return false;
    return true;
}

std::string Shape::str() const {
    std::string s = "(";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + ")";
}

Storage::Storage(std::size_t n) : data(pool_alloc(n)), size(n) {}
Storage::Storage(std::size_t n, bool shape) : data(shape ? nullptr : pool_alloc(n)), size(n), shape_only(shape) {}

namespace {
thread_local bool shape_only_scope = false;
}

ShapeOnly::ShapeOnly() : was_(shape_only_scope) { shape_only_scope = true; }
ShapeOnly::~ShapeOnly() { shape_only_scope = was_; }
bool ShapeOnly::active() { return shape_only_scope; }

Storage::~Storage() {
    pool_free(data);
    pool_free(grad);
}

Tensor Tensor::empty(const Shape& shape) {
    for (int i = 0; i < shape.rank; ++i)
        if (shape.dims[i] < 0) throw std::invalid_argument("Tensor: negative extent in shape " + shape.str());
    Tensor t;
    t.storage_ = std::make_shared<Storage>(static_cast<std::size_t>(shape.numel()), shape_only_scope);
    t.shape_ = shape;
    return t;
}

Tensor Tensor::zeros(const Shape& shape) { return full(shape, real(0)); }

Tensor Tensor::full(const Shape& shape, real value) {
    Tensor t = empty(shape);
    if (t.shape_only()) return t;
    real* p = t.data();
    for (std::int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = value;
    return t;
}

Tensor Tensor::from(const std::vector<real>& values, const Shape& shape) {
    if (static_cast<std::int64_t>(values.size()) != shape.numel())
        throw std::invalid_argument("Tensor::from: " + std::to_string(values.size()) + " values for shape " +
                                    shape.str());
    Tensor t = empty(shape);
    std::copy(values.begin(), values.end(), t.data());
    return t;
}

real Tensor::item() const {
    if (numel() != 1) throw std::invalid_argument("Tensor::item: tensor of shape " + shape_.str() + " is not one value");
    return data()[0];
}

std::vector<real> Tensor::to_vector() const { return std::vector<real>(data(), data() + numel()); }

Tensor& Tensor::set_requires_grad(bool on) {
    storage_->requires_grad = on;
    return *this;
}

// A stale buffer (zero_grad ran) is zeroed only when somebody adds to it or reads it; one that an op
// overwrites as a whole (grad_target) never is.
real* Tensor::grad() {
    Storage& s = *storage_;
    if (!s.grad) s.grad = pool_alloc(s.size);
    else if (!s.grad_stale) return s.grad + offset_;
    std::memset(s.grad, 0, s.size * sizeof(real));
    s.grad_stale = false;
    return s.grad + offset_;
}

const real* Tensor::grad() const {
    if (!has_grad()) return nullptr;
    return const_cast<Tensor*>(this)->grad();  // a stale buffer reads as zeros: zero it now
}

GradTarget Tensor::grad_target() {
    Storage& s = *storage_;
    const bool whole = offset_ == 0 && static_cast<std::size_t>(numel()) == s.size;
    if (!whole) return {grad(), false};
    if (!s.grad) s.grad = pool_alloc(s.size);
    else if (!s.grad_stale) return {s.grad, false};
    s.grad_stale = false;
    return {s.grad, true};
}

GradTarget Tensor::grad_over_value() {
    Storage& s = *storage_;
    const bool whole = offset_ == 0 && static_cast<std::size_t>(numel()) == s.size;
    if (!whole || s.is_leaf || (s.grad && !s.grad_stale) || storage_.use_count() > 2 || !s.data) return {nullptr, false};
    pool_free(s.grad);
    s.grad = s.data;
    s.data = nullptr;
    s.grad_stale = false;
    return {s.grad, true};
}

void Tensor::recompute_with(std::function<void(real* values)> fill) { storage_->recompute = std::move(fill); }

void Tensor::drop_values() {
    Storage& s = *storage_;
    if (s.is_leaf || s.shape_only) throw std::logic_error("drop_values: only an op's output can let its values go");
    pool_free(s.data);
    s.data = nullptr;
    s.values_dropped = true;
}

real* Tensor::values_elsewhere() const {
    Storage& s = *storage_;
    if (!s.values_dropped) return nullptr;  // shape-only, or the buffer became the gradient's (grad_over_value)
    if (!s.recompute)
        throw std::logic_error("a tensor's values were read after drop_values(), and nothing can compute them again");
    // Not for a parallel region: backward() computes a record's inputs before its closure runs.
    real* values = pool_alloc(s.size);
    s.recompute(values);
    s.data = values;
    s.values_dropped = false;
    return s.data + offset_;
}

std::vector<real> Tensor::grad_vector() const {
    if (!has_grad()) return std::vector<real>(numel(), real(0));
    const real* g = grad();
    return std::vector<real>(g, g + numel());
}

void Tensor::zero_grad() {
    if (!storage_ || !storage_->grad) return;
    if (offset_ == 0 && static_cast<std::size_t>(numel()) == storage_->size) storage_->grad_stale = true;
    else std::memset(storage_->grad + offset_, 0, numel() * sizeof(real));
}

void Tensor::release_grad() {
    if (!storage_ || !storage_->grad) return;
    if (offset_ != 0 || static_cast<std::size_t>(numel()) != storage_->size) return zero_grad();
    pool_free(storage_->grad);
    storage_->grad = nullptr;
    storage_->grad_stale = false;
}

Tensor Tensor::reshape(const Shape& shape) const {
    Shape s = shape;
    int infer = -1;
    std::int64_t known = 1;
    for (int i = 0; i < s.rank; ++i) {
        if (s.dims[i] == -1) {
            if (infer >= 0) throw std::invalid_argument("reshape: more than one -1 in " + shape.str());
            infer = i;
        } else {
            known *= s.dims[i];
        }
    }
    if (infer >= 0 && known > 0 && numel() % known == 0) s.dims[infer] = numel() / known;
    // Every extent must end up known and non-negative: (-2, -12) also multiplies to 24 but is no shape.
    bool valid = s.numel() == numel();
    for (int i = 0; i < s.rank; ++i) valid = valid && s.dims[i] >= 0;
    if (!valid)
        throw std::invalid_argument("reshape: cannot view " + shape_.str() + " as " + shape.str());
    Tensor t = *this;
    t.shape_ = s;
    return t;
}

Tensor Tensor::rows(std::int64_t begin, std::int64_t end) const {
    if (rank() == 0 || begin < 0 || end > shape_.dims[0] || begin > end)
        throw std::invalid_argument("rows: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                    ") is not inside the first axis of " + shape_.str());
    Tensor t = *this;
    t.offset_ += begin * (shape_.dims[0] ? numel() / shape_.dims[0] : 0);
    t.shape_.dims[0] = end - begin;
    return t;
}

Tensor Tensor::clone() const {
    Tensor t = empty(shape_);
    std::memcpy(t.data(), data(), numel() * sizeof(real));
    return t;
}

TF_NAMESPACE_END
