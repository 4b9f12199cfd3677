// Tensor storage, element access and the seeded, counter-based random factories.
#include "tokamax/core/tensor.h"

#include <sys/mman.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "core/random.h"
#include "core/sanitizers.h"
#include "core/tensor_cache.h"
#include "tokamax/core/error.h"

namespace tokamax {
namespace {

std::atomic<int64_t> g_alloc_count{0};
std::atomic<int64_t> g_alloc_bytes{0};

// SplitMix64 of (seed, index): a counter-based generator, so element i has the same value
// regardless of thread count, machine or fill order.
uint64_t mix(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index * 0xD1B54A32D192ED03ull + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
double unit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }  // [0, 1)

void store(void* base, DType dtype, int64_t offset, double v) {
  switch (dtype) {
    case DType::kF32:
      static_cast<float*>(base)[offset] = static_cast<float>(v);
      return;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[offset] = f32_to_bf16(static_cast<float>(v));
      return;
    case DType::kF16:
      static_cast<uint16_t*>(base)[offset] = f32_to_f16(static_cast<float>(v));
      return;
    case DType::kF64:
      static_cast<double*>(base)[offset] = v;
      return;
    case DType::kI32:
      static_cast<int32_t*>(base)[offset] = static_cast<int32_t>(v);
      return;
    case DType::kI64:
      static_cast<int64_t*>(base)[offset] = static_cast<int64_t>(v);
      return;
    case DType::kU8:
      static_cast<uint8_t*>(base)[offset] = static_cast<uint8_t>(v);
      return;
    case DType::kBool:
      static_cast<uint8_t*>(base)[offset] = v != 0.0;
      return;
    case DType::kI8:
      static_cast<int8_t*>(base)[offset] = static_cast<int8_t>(v);
      return;
  }
}

double load(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kF32:
      return static_cast<const float*>(base)[offset];
    case DType::kBF16:
      return bf16_to_f32(static_cast<const uint16_t*>(base)[offset]);
    case DType::kF16:
      return f16_to_f32(static_cast<const uint16_t*>(base)[offset]);
    case DType::kF64:
      return static_cast<const double*>(base)[offset];
    case DType::kI32:
      return static_cast<const int32_t*>(base)[offset];
    case DType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(base)[offset]);
    case DType::kU8:
      return static_cast<const uint8_t*>(base)[offset];
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[offset] ? 1.0 : 0.0;
    case DType::kI8:
      return static_cast<const int8_t*>(base)[offset];
  }
  return 0.0;
}

}  // namespace

Strides contiguous_strides(const Shape& shape) {
  Strides s(shape.size(), 1);
  for (int64_t i = static_cast<int64_t>(shape.size()) - 2; i >= 0; --i) {
    s[i] = s[i + 1] * shape[i + 1];
  }
  return s;
}

TensorView::TensorView(void* data, DType dtype, Shape shape)
    : TensorView(data, dtype, shape, contiguous_strides(shape)) {}

TensorView::TensorView(void* data, DType dtype, Shape shape, Strides strides)
    : data_(data), dtype_(dtype), shape_(std::move(shape)), strides_(std::move(strides)) {
  if (strides_.size() != shape_.size()) {
    throw InvalidArgument("TensorView: strides rank " + std::to_string(strides_.size()) +
                          " differs from shape " + shape_str(shape_));
  }
  num_elements(shape_);  // validates dimensions
}

bool TensorView::is_contiguous() const {
  if (num_elements(shape_) <= 1) return true;
  const Strides expected = contiguous_strides(shape_);
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] != 1 && strides_[i] != expected[i]) return false;
  }
  return true;
}

namespace {
int64_t offset_of(const Shape& shape, const Strides& strides, int64_t flat) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    const int64_t n = shape[d];
    off += (flat % n) * strides[d];
    flat /= n;
  }
  return off;
}
}  // namespace

double TensorView::get(int64_t i) const {
  return load(data_, dtype_, offset_of(shape_, strides_, i));
}
void TensorView::set(int64_t i, double v) const {
  store(data_, dtype_, offset_of(shape_, strides_, i), v);
}

size_t tensor_cache_limit_mb(const char* value) {
  if (!value || !*value) return 256;
  constexpr long long kMax = int64_t{1} << 20;
  char* end = nullptr;
  const long long v = std::strtoll(value, &end, 10);
  if (*end != '\0' || v < 0 || v > kMax) {
    throw InvalidArgument("TOKAMAX_TENSOR_CACHE_MB='" + std::string(value) +
                          "': expected an integer number of megabytes in [0, " +
                          std::to_string(kMax) + "] (0 turns the buffer cache off)");
  }
  return static_cast<size_t>(v);
}

namespace {

// Large buffers freed recently, kept for the next Tensor of the same allocation size. A fresh
// mapping costs a page fault and the kernel's zeroing of every page on first touch, while
// callers allocate the same shapes step after step: a bf16 prefill ragged_dot on AMX (8 x 512
// rows, K = N = 1024, its 16 MB output) took 7.3 ms allocating its output, 5.4 writing into a
// buffer it was given. Bounded in blocks and bytes (TOKAMAX_TENSOR_CACHE_MB, default 256; 0
// turns it off): what it holds stays resident, never returned to the system while cached. Off
// under AddressSanitizer and MemorySanitizer, whose checks it would hide.
class BlockCache {
 public:
  static BlockCache& instance() {
    static BlockCache* cache = new BlockCache;  // never destroyed: Tensors outlive statics
    return *cache;
  }
  void* take(size_t bytes) {
    if (bytes < kMinBytes || limit_ == 0) return nullptr;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t i = blocks_.size(); i-- > 0;) {
        if (blocks_[i].bytes != bytes) continue;
        p = blocks_[i].p;
        total_ -= bytes;
        blocks_.erase(blocks_.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
    }
    // Debugging aid (the test presets set it): a reused block full of NaN / 0xFF bytes, so that
    // code reading a new Tensor before writing it fails instead of seeing old values.
    if (p && poison_) std::memset(p, 0xFF, bytes);
    return p;
  }
  // Keeps p (true) or leaves it to the caller to free (false). Evicts the oldest blocks to
  // stay within the bounds. Allocates nothing (it runs in destructors): blocks_ has room for
  // kMaxBlocks from the start.
  bool put(void* p, size_t bytes) {
    if (bytes < kMinBytes || bytes > limit_ / 2) return false;
    void* evicted[kMaxBlocks];
    size_t n_evicted = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      while (!blocks_.empty() && (total_ + bytes > limit_ || blocks_.size() >= kMaxBlocks)) {
        evicted[n_evicted++] = blocks_.front().p;
        total_ -= blocks_.front().bytes;
        blocks_.erase(blocks_.begin());
      }
      blocks_.push_back({p, bytes});
      total_ += bytes;
    }
    for (size_t i = 0; i < n_evicted; ++i) std::free(evicted[i]);
    return true;
  }

 private:
  static constexpr size_t kMinBytes = size_t{1} << 20;
  static constexpr size_t kMaxBlocks = 8;
  BlockCache() {
    // Runs at the first Tensor's construction (take), never first in a destructor: a bad value
    // throws there, as a bad TOKAMAX_NUM_THREADS does.
    const size_t mb = tensor_cache_limit_mb(std::getenv("TOKAMAX_TENSOR_CACHE_MB"));
    limit_ = kMemorySanitizer ? 0 : mb << 20;
    blocks_.reserve(kMaxBlocks);
    const char* poison = std::getenv("TOKAMAX_TENSOR_CACHE_POISON");
    poison_ = poison && *poison && std::strcmp(poison, "0") != 0;
  }
  struct Block {
    void* p;
    size_t bytes;
  };
  std::mutex mu_;
  std::vector<Block> blocks_;  // oldest first
  size_t total_ = 0;
  size_t limit_ = 0;
  bool poison_ = false;
};

}  // namespace

void Tensor::Free::operator()(void* p) const {
  if (!BlockCache::instance().put(p, bytes)) std::free(p);
}

Tensor::Tensor(Shape shape, DType dtype) : dtype_(dtype), shape_(std::move(shape)) {
  const int64_t bytes = ShapeDtype{shape_, dtype_}.bytes();
  nbytes_ = static_cast<size_t>(bytes);
  // Round up to the alignment (aligned_alloc requires it) and never ask for 0 bytes, so that
  // data() is a valid, aligned pointer even for empty tensors.
  // Large tensors (weights, packed panels) go on 2 MiB boundaries and ask for transparent huge
  // pages: kernels stream them through many pages at once, and 4 KiB pages cost a TLB walk
  // every 4 KiB of every stream (2-thread streaming read here: 34 vs 32-33 GB/s, interleaved).
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t align = nbytes_ >= 2 * kHuge ? kHuge : kAlignment;
  const size_t alloc = (nbytes_ + align - 1) / align * align + kAlignment;
  const size_t rounded = (alloc + align - 1) / align * align;
  void* p = BlockCache::instance().take(rounded);
  if (!p) {
    p = std::aligned_alloc(align, rounded);
    if (!p) {
      throw OutOfMemory("cannot allocate a tensor " + ShapeDtype{shape_, dtype_}.str() + " (" +
                        std::to_string(bytes) + " bytes)");
    }
    if (align == kHuge) madvise(p, alloc, MADV_HUGEPAGE);  // advisory; failure is harmless
  }
  data_ = std::unique_ptr<void, Free>(p, Free{rounded});
  g_alloc_count.fetch_add(1, std::memory_order_relaxed);
  g_alloc_bytes.fetch_add(static_cast<int64_t>(nbytes_), std::memory_order_relaxed);
}

TensorAllocations tensor_allocations() {
  return {g_alloc_count.load(std::memory_order_relaxed),
          g_alloc_bytes.load(std::memory_order_relaxed)};
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t(std::move(shape), dtype);
  std::memset(t.data(), 0, t.nbytes());
  return t;
}

Tensor Tensor::full(Shape shape, DType dtype, double value) {
  Tensor t(std::move(shape), dtype);
  fill_value(t.view(), value);
  return t;
}

Tensor Tensor::randn(Shape shape, DType dtype, uint64_t seed) {
  Tensor t(std::move(shape), dtype);
  fill_randn(t.view(), seed);
  return t;
}

Tensor Tensor::uniform(Shape shape, DType dtype, uint64_t seed, double low, double high) {
  Tensor t(std::move(shape), dtype);
  fill_uniform(t.view(), seed, low, high);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape_, dtype_);
  if (nbytes_) std::memcpy(t.data(), data(), nbytes_);
  return t;
}

void Tensor::poison() {
  if (!is_floating(dtype_)) {
    std::memset(data(), 0xFF, nbytes_);
    return;
  }
  fill_value(view(), std::numeric_limits<double>::quiet_NaN());
}

void fill_randn(const TensorView& v, uint64_t seed) {
  if (!v.is_contiguous()) throw InvalidArgument("fill_randn: view must be contiguous");
  const int64_t n = v.size();
  for (int64_t i = 0; i < n; ++i) {
    // Box-Muller on two independent counter-based uniforms; u1 in (0, 1].
    const double u1 = 1.0 - unit(mix(seed, 2 * static_cast<uint64_t>(i)));
    const double u2 = unit(mix(seed, 2 * static_cast<uint64_t>(i) + 1));
    store(v.data(), v.dtype(), i,
          std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
}

double uniform_at(uint64_t seed, uint64_t index) { return unit(mix(seed, index)); }

void fill_uniform(const TensorView& v, uint64_t seed, double low, double high) {
  if (!v.is_contiguous()) throw InvalidArgument("fill_uniform: view must be contiguous");
  if (!(low <= high)) throw InvalidArgument("fill_uniform: low must be <= high");
  const int64_t n = v.size();
  for (int64_t i = 0; i < n; ++i) {
    store(v.data(), v.dtype(), i, low + (high - low) * unit(mix(seed, static_cast<uint64_t>(i))));
  }
}

void fill_value(const TensorView& v, double value) {
  const int64_t n = v.size();
  if (v.is_contiguous() && v.dtype() == DType::kF32) {
    float* p = v.data_as<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(value);
    return;
  }
  for (int64_t i = 0; i < n; ++i) v.set(i, value);
}

}  // namespace tokamax
