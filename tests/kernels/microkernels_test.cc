// The microkernel tester (XNNPACK's manner): every kernel of every kernel set this CPU runs
// (portable, AVX2, AVX-512: f32, bf16 dot, multi-panel, weight streaming) against a double-
// precision computation of its own contract (microkernels.h), swept over tile heights, depths
// (1, odd, around the vector width), partial panels, accumulate on and off, and strides; the
// C tile's columns past the panel and its rows past the tile must stay untouched.
#include "kernels/microkernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/grouped_gemm.h"
#include "tests/kernels/kernel_sets.h"
#include "tests/test_seed.h"
#include "tokamax/tokamax.h"

namespace tokamax {
namespace {

namespace k = kernels;

std::vector<float> random_floats(size_t n, bool bf16_exact) {
  Tensor t = Tensor::randn({static_cast<int64_t>(n)}, DType::kF32, fresh_seed());
  std::vector<float> v(t.data_as<float>(), t.data_as<float>() + n);
  if (bf16_exact) {
    for (float& x : v) x = bf16_to_f32(f32_to_bf16(x));
  }
  return v;
}

constexpr float kSentinel = -777.0f;

std::vector<uint16_t> bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}

// A streaming kernel's operands: a (mr rows of lda), b ([K][ldb], or [cols][ldb] transposed) as
// floats and as bf16 bits, c0 random, and c: sentinels, with c0's tile where the kernel
// accumulates into c.
struct StreamOperands {
  std::vector<float> a, bf, c, c0;
  std::vector<uint16_t> bh;
};
StreamOperands stream_operands(int mr, int64_t K, int64_t cols, int64_t lda, int64_t ldb,
                               int64_t ldc, bool trans, bool acc, bool a_bf16, bool b_bf16) {
  StreamOperands o;
  o.a = random_floats(static_cast<size_t>(mr * lda), a_bf16);
  o.bf = random_floats(static_cast<size_t>((trans ? cols : K) * ldb), b_bf16);
  o.bh = bf16_bits(o.bf);
  o.c.assign(static_cast<size_t>((mr + 1) * ldc), kSentinel);
  o.c0 = random_floats(static_cast<size_t>(mr * ldc), false);
  for (int i = 0; acc && i < mr; ++i) {
    for (int64_t j = 0; j < cols; ++j) o.c[i * ldc + j] = o.c0[i * ldc + j];
  }
  return o;
}

// Packed B panels are 64-byte aligned (the kernels load them with aligned loads): panel strides
// round up to 16 elements, storage comes from a Tensor (64-byte aligned).
int64_t aligned_stride(int64_t elems) { return (elems + 15) / 16 * 16; }
template <class T>
Tensor aligned_copy(const std::vector<T>& v) {
  Tensor t({static_cast<int64_t>(v.size() * sizeof(T))}, DType::kU8);
  std::memcpy(t.data(), v.data(), v.size() * sizeof(T));
  return t;
}

// A C tile of rows + 1 rows of ldc: random inside rows x cols, the sentinel elsewhere (where the
// kernel must not write).
std::vector<float> tile_with_sentinels(int rows, int64_t cols, int64_t ldc) {
  std::vector<float> c = random_floats(static_cast<size_t>((rows + 1) * ldc), false);
  for (int i = 0; i <= rows; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      if (i == rows || j >= cols) c[i * ldc + j] = kSentinel;
    }
  }
  return c;
}

// The expected rows x cols tile: dot(i, j), plus c0's element when accumulating.
template <class Dot>
std::vector<double> expected_tile(int rows, int64_t cols, const std::vector<float>& c0, int64_t ldc,
                                  bool acc, Dot dot) {
  std::vector<double> want(static_cast<size_t>(rows * cols));
  for (int i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j)
      want[i * cols + j] = (acc ? c0[i * ldc + j] : 0.0) + dot(i, j);
  }
  return want;
}

// c (rows x ldc, sentinel-filled where the kernel must not write) against want (rows x cols).
void expect_tile(const std::vector<float>& c, const std::vector<double>& want, int rows,
                 int64_t cols, int64_t ldc, int c_rows, const std::string& what) {
  for (int i = 0; i < c_rows; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[i * ldc + j];
      if (i < rows && j < cols) {
        const double w = want[i * cols + j];
        ASSERT_NEAR(got, w, 1e-4 * (1 + std::abs(w))) << what << " at " << i << "," << j;
      } else {
        ASSERT_EQ(got, kSentinel) << what << " wrote outside the tile at " << i << "," << j;
      }
    }
  }
}

TEST(Microkernels, F32AndMultiPanel) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    const int nr = ks->nr;
    for (int mr = 1; mr <= ks->max_mr; ++mr) {
      for (int64_t kc : {1, 2, 7, 16, 33}) {
        // A's layout: rows kc + 3 apart, transposed (1), or rows at the strides the AVX-512
        // set fixes at compile time (attention's S blocks: block_kv apart).
        for (int64_t layout : {0, 1, 128, 256, 512}) {
          const bool trans_a = layout == 1;
          for (bool acc : {false, true}) {
            // Up to 4 panels for the multi-panel kernel, panel_stride past one panel.
            const int np = ks->f32_multi && mr <= k::kMultiMaxMr ? ks->multi_np[mr] : 0;
            const int panels = std::max(1, np);
            const int64_t panel_stride = aligned_stride(kc * nr + 5);
            // Rows (or columns) of A apart.
            const int64_t lda = trans_a ? mr + 3 : layout == 0 ? kc + 3 : layout;
            const int64_t rs = trans_a ? 1 : lda, cs = trans_a ? lda : 1;
            const std::vector<float> a =
                random_floats(static_cast<size_t>(lda * (trans_a ? kc : mr)), false);
            const std::vector<float> b =
                random_floats(static_cast<size_t>(panel_stride * panels), false);
            const Tensor bt = aligned_copy(b);
            const float* bp = bt.data_as<float>();
            const int64_t ldc = panels * nr + 3;
            const std::vector<float> c0 = tile_with_sentinels(mr, panels * nr, ldc);
            const std::vector<double> want =
                expected_tile(mr, panels * nr, c0, ldc, acc, [&](int i, int64_t j) {
                  double s = 0;
                  for (int64_t kk = 0; kk < kc; ++kk) {
                    s += static_cast<double>(a[i * rs + kk * cs]) *
                         b[j / nr * panel_stride + kk * nr + j % nr];
                  }
                  return s;
                });
            const std::string what = std::string(ks->name) + " mr=" + std::to_string(mr) +
                                     " kc=" + std::to_string(kc) + (trans_a ? " A^T" : "") +
                                     " lda=" + std::to_string(lda) + (acc ? " acc" : "");
            // The single-panel kernel, panel by panel.
            std::vector<float> c = c0;
            // (Each call also prefetching the next panel, as the grouped GEMM has it do.)
            for (int p = 0; p < panels; ++p) {
              k::L2Ahead ahead;
              if (p + 1 < panels)
                ahead = {reinterpret_cast<const char*>(bp + (p + 1) * panel_stride), kc * nr * 4};
              ks->f32(mr, kc, a.data(), rs, cs, bp + p * panel_stride, c.data() + p * nr, ldc, acc,
                      ahead);
            }
            expect_tile(c, want, mr, panels * nr, ldc, mr + 1, what + " f32");
            if (np > 1) {
              c = c0;
              ks->f32_multi(mr, kc, a.data(), rs, cs, bp, panel_stride, c.data(), ldc, acc);
              expect_tile(c, want, mr, panels * nr, ldc, mr + 1, what + " f32_multi");
            }
          }
        }
      }
    }
  }
}

TEST(Microkernels, Bf16DotAndMultiPanel) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    if (!ks->bf16) continue;
    const int nr = ks->nr;
    for (int mr = 1; mr <= ks->max_mr; ++mr) {
      for (int64_t kp : {1, 3, 8, 17}) {
        for (bool acc : {false, true}) {
          const int np = ks->bf16_multi && mr <= k::kMultiMaxMr ? ks->multi_np[mr] : 0;
          const int panels = std::max(1, np);
          const int64_t a_stride = mr + 2, panel_stride = aligned_stride(kp * nr + 3);
          auto pairs = [&](size_t n) {
            std::vector<float> v = random_floats(2 * n, true);
            std::vector<uint32_t> out(n);
            for (size_t i = 0; i < n; ++i)
              out[i] = f32_to_bf16(v[2 * i]) | (uint32_t{f32_to_bf16(v[2 * i + 1])} << 16);
            return out;
          };
          const std::vector<uint32_t> a = pairs(static_cast<size_t>(kp * a_stride));
          const std::vector<uint32_t> b = pairs(static_cast<size_t>(panel_stride * panels));
          const Tensor bt = aligned_copy(b);
          const uint32_t* bp = bt.data_as<uint32_t>();
          auto lo = [](uint32_t x) { return static_cast<double>(bf16_to_f32(x & 0xFFFF)); };
          auto hi = [](uint32_t x) { return static_cast<double>(bf16_to_f32(x >> 16)); };
          const int64_t ldc = panels * nr + 2;
          const std::vector<float> c0 = tile_with_sentinels(mr, panels * nr, ldc);
          const std::vector<double> want =
              expected_tile(mr, panels * nr, c0, ldc, acc, [&](int i, int64_t j) {
                double s = 0;
                for (int64_t q = 0; q < kp; ++q) {
                  const uint32_t x = a[q * a_stride + i],
                                 w = b[j / nr * panel_stride + q * nr + j % nr];
                  s += lo(x) * lo(w) + hi(x) * hi(w);
                }
                return s;
              });
          const std::string what = std::string(ks->name) + " mr=" + std::to_string(mr) +
                                   " kp=" + std::to_string(kp) + (acc ? " acc" : "");
          std::vector<float> c = c0;
          for (int p = 0; p < panels; ++p) {
            ks->bf16(mr, kp, a.data(), a_stride, bp + p * panel_stride, c.data() + p * nr, ldc,
                     acc);
          }
          expect_tile(c, want, mr, panels * nr, ldc, mr + 1, what + " bf16");
          if (np > 1) {
            c = c0;
            ks->bf16_multi(mr, kp, a.data(), a_stride, bp, panel_stride, c.data(), ldc, acc);
            expect_tile(c, want, mr, panels * nr, ldc, mr + 1, what + " bf16_multi");
          }
        }
      }
    }
  }
}

// stream (c = a b), stream_t (c = a b^T) and stream_acc (c += a b, from c's random values)
// against double sums: every row count, depths around the vector width (0 included), column
// counts around the 16-, 32- and 64-column blocks, f32 and bf16 weights, strides wider than the
// rows; nothing written past the last row.
TEST(Microkernels, WeightStreamingBothLayouts) {
  enum Kind { kForward, kTransposed, kAccumulate };
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    for (Kind kind : {kForward, kTransposed, kAccumulate}) {
      const k::StreamKernel stream = kind == kForward      ? ks->stream
                                     : kind == kTransposed ? ks->stream_t
                                                           : nullptr;
      const bool trans = kind == kTransposed, acc = kind == kAccumulate;
      const char* name = kind == kForward ? " stream" : trans ? " stream_t" : " stream_acc";
      if (acc ? !ks->stream_acc : !stream) continue;
      for (int mr = 0; mr <= k::kStreamMaxMr; ++mr) {
        for (int64_t K : {0, 1, 7, 8, 9, 16, 17, 40}) {
          for (int64_t cols : {1, 15, 16, 17, 33, 2 * ks->nr + 5, 64, 69, 133}) {
            for (bool bf16 : {false, true}) {
              const int64_t lda = K + 2, ldb = (trans ? K : cols) + 3, ldc = cols + 4;
              StreamOperands o =
                  stream_operands(mr, K, cols, lda, ldb, ldc, trans, acc, bf16, bf16);
              const std::vector<float>&a = o.a, &bf = o.bf, &c0 = o.c0;
              const std::vector<uint16_t>& bh = o.bh;
              std::vector<float>& c = o.c;
              std::vector<double> want(static_cast<size_t>(mr * cols));
              for (int i = 0; i < mr; ++i) {
                for (int64_t j = 0; j < cols; ++j) {
                  double s = acc ? c0[i * ldc + j] : 0.0;
                  for (int64_t kk = 0; kk < K; ++kk)
                    s += static_cast<double>(a[i * lda + kk]) *
                         bf[trans ? j * ldb + kk : kk * ldb + j];
                  want[i * cols + j] = s;
                }
              }
              const void* b = bf16 ? static_cast<const void*>(bh.data()) : bf.data();
              if (acc) {  // prefetching the K rows after b's and lines 16 KiB on (a prefetch
                          // reads nothing)
                ks->stream_acc(mr, K, a.data(), lda, b, bf16, ldb, cols, c.data(), ldc, K,
                               cols % 2 ? 16 << 10 : 0);
              } else {
                stream(mr, K, a.data(), lda, b, bf16, ldb, cols, c.data(), ldc);
              }
              expect_tile(c, want, mr, cols, ldc, mr + 1,
                          std::string(ks->name) + name + " mr=" + std::to_string(mr) +
                              " K=" + std::to_string(K) + " cols=" + std::to_string(cols) +
                              (bf16 ? " bf16" : " f32"));
            }
          }
        }
      }
    }
  }
}

// dot_stream_t (c = a b^T) and dot_stream_acc (c += a b) on the bf16 dot, where a set has them,
// against double sums of a rounded to bf16 (the kernels round it) times the bf16 b: every row
// count, depths around the 32-value step and past the kernels' 512 chunk (0 and odd included),
// column counts around the 4-position and 32- and 64-column blocks, strides wider than the
// rows; nothing written past the last row or column.
TEST(Microkernels, DecodeBf16DotKernels) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    for (bool trans : {true, false}) {
      if (trans ? !ks->dot_stream_t : !ks->dot_stream_acc) continue;
      for (int mr = 0; mr <= k::kStreamMaxMr; ++mr) {
        for (int64_t K : {0, 1, 2, 3, 31, 32, 33, 64, 65, 600}) {
          for (int64_t cols : {1, 3, 4, 5, 16, 17, 31, 32, 33, 64, 65, 133}) {
            const int64_t lda = K + 2, ldb = (trans ? K : cols) + 3, ldc = cols + 4;
            StreamOperands o =
                stream_operands(mr, K, cols, lda, ldb, ldc, trans, !trans, false, true);
            const std::vector<float>&a = o.a, &bf = o.bf, &c0 = o.c0;
            std::vector<float>& c = o.c;
            const std::vector<uint16_t>& bh = o.bh;
            if (trans) {
              ks->dot_stream_t(mr, K, a.data(), lda, bh.data(), ldb, cols, c.data(), ldc);
            } else {  // prefetching as the stream_acc test
              ks->dot_stream_acc(mr, K, a.data(), lda, bh.data(), ldb, cols, c.data(), ldc, K,
                                 cols % 2 ? 16 << 10 : 0);
            }
            const std::string what = std::string(ks->name) +
                                     (trans ? " dot_stream_t" : " dot_stream_acc") +
                                     " mr=" + std::to_string(mr) + " K=" + std::to_string(K) +
                                     " cols=" + std::to_string(cols);
            for (int i = 0; i <= mr; ++i) {
              for (int64_t j = 0; j < ldc; ++j) {
                const float got = c[i * ldc + j];
                if (i == mr || j >= cols) {
                  ASSERT_EQ(got, kSentinel) << what << " wrote outside at " << i << "," << j;
                  continue;
                }
                double want = trans ? 0.0 : c0[i * ldc + j], mag = std::abs(want);
                for (int64_t kk = 0; kk < K; ++kk) {
                  const double t = static_cast<double>(bf16_to_f32(f32_to_bf16(a[i * lda + kk]))) *
                                   bf[trans ? j * ldb + kk : kk * ldb + j];
                  want += t;
                  mag += std::abs(t);
                }
                ASSERT_NEAR(got, want, 1e-5 * mag + 1e-6) << what << " at " << i << "," << j;
              }
            }
          }
        }
      }
    }
  }
}

// stream_heads_t (f32 FMAs, b f32 or bf16) and dot_heads_t (the bf16 dot, a rounded to bf16):
// q k^T for several heads, position by position, against double sums: row counts, head counts,
// depths around the 16- and 32-value steps, position strides wider than the heads, with and
// without the prefetch; nothing written past the last row or column.
TEST(Microkernels, DecodeHeadsKernels) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    for (bool dot : {false, true}) {
      const k::StreamHeadsKernel kernel = dot ? ks->dot_heads_t : ks->stream_heads_t;
      if (!kernel) continue;
      for (int mr = 1; mr <= k::kStreamMaxMr; ++mr) {
        for (int heads : {1, 3, 8}) {
          for (int64_t K : {1, 15, 17, 31, 32, 33, 128}) {
            if (dot && heads * mr * ((K + 31) / 32 * 32) > k::kDotHeadsMaxValues) continue;
            for (int64_t cols : {1, 4, 5, 33}) {
              for (bool bf16 : {false, true}) {
                if (dot && !bf16) continue;
                const int64_t ldb = heads * K + 3, ldc = cols + 4, rows = int64_t{heads} * mr;
                const std::vector<float> a = random_floats(static_cast<size_t>(rows * K), false);
                const std::vector<float> bf = random_floats(static_cast<size_t>(cols * ldb), bf16);
                const std::vector<uint16_t> bh = bf16_bits(bf);
                std::vector<float> c(static_cast<size_t>((rows + 1) * ldc), kSentinel);
                const void* b = bf16 ? static_cast<const void*>(bh.data()) : bf.data();
                // The prefetches read nothing: any address, here b's own rows, and the lines
                // 16 KiB on.
                kernel(mr, heads, K, a.data(), b, bf16, ldb, cols, c.data(), ldc,
                       cols % 2 ? b : nullptr, ldb * (bf16 ? 2 : 4), 64, cols % 3 ? 16 << 10 : 0);
                const std::string what =
                    std::string(ks->name) + (dot ? " dot_heads_t" : " stream_heads_t") +
                    " mr=" + std::to_string(mr) + " heads=" + std::to_string(heads) +
                    " K=" + std::to_string(K) + " cols=" + std::to_string(cols) +
                    (bf16 ? " bf16" : "");
                for (int64_t r = 0; r <= rows; ++r) {
                  for (int64_t j = 0; j < ldc; ++j) {
                    const float got = c[r * ldc + j];
                    if (r == rows || j >= cols) {
                      ASSERT_EQ(got, kSentinel) << what << " wrote outside at " << r << "," << j;
                      continue;
                    }
                    double want = 0, mag = 0;
                    for (int64_t kk = 0; kk < K; ++kk) {
                      const float x = dot ? bf16_to_f32(f32_to_bf16(a[r * K + kk])) : a[r * K + kk];
                      const double t = static_cast<double>(x) * bf[j * ldb + (r / mr) * K + kk];
                      want += t;
                      mag += std::abs(t);
                    }
                    ASSERT_NEAR(got, want, 1e-5 * mag + 1e-6) << what << " at " << r << "," << j;
                  }
                }
              }
            }
          }
        }
      }
    }
  }
}

// pack_a_f32 (scalar) and each ISA's vector one against the layout written out index by index:
// dst[t][k][mr] = a[(t*mr + i) * lda + k0 + k], zero past the last row; every tile height,
// depths around the 16-value step, a k0 offset and a row stride wider than the block; nothing
// written past the last tile.
TEST(Microkernels, F32LhsPackingLayout) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    // Every tile height, then the panel widths attention packs K^T panels with (up to 32).
    std::vector<int> heights;
    for (int mr = 1; mr <= ks->max_mr; ++mr) heights.push_back(mr);
    for (int mr : {16, 17, 31, 32}) {
      if (mr > ks->max_mr) heights.push_back(mr);
    }
    for (int mr : heights) {
      for (int64_t rows : {int64_t{1}, int64_t{mr}, int64_t{mr} + 1, int64_t{3 * mr} - 1}) {
        for (int64_t kc : {1, 15, 16, 17, 40}) {
          const int64_t k0 = 3, lda = k0 + kc + 5, tiles = (rows + mr - 1) / mr;
          const std::vector<float> a = random_floats(static_cast<size_t>(rows * lda), false);
          const size_t size = static_cast<size_t>(tiles * mr * kc);
          std::vector<float> want(size + 16, kSentinel);
          for (int64_t t = 0; t < tiles; ++t) {
            for (int64_t kk = 0; kk < kc; ++kk) {
              for (int i = 0; i < mr; ++i) {
                const int64_t r = t * mr + i;
                want[(t * kc + kk) * mr + i] = r < rows ? a[r * lda + k0 + kk] : 0.0f;
              }
            }
          }
          std::vector<float> got(size + 16, kSentinel);
          k::pack_a_f32(a.data(), lda, rows, k0, kc, mr, got.data());
          ASSERT_EQ(got, want) << "scalar mr=" << mr << " rows=" << rows << " kc=" << kc;
          if (!ks->pack_a_f32) continue;
          std::fill(got.begin(), got.end(), kSentinel);
          ks->pack_a_f32(a.data(), lda, rows, k0, kc, mr, got.data());
          ASSERT_EQ(got, want) << ks->name << " mr=" << mr << " rows=" << rows << " kc=" << kc;
        }
      }
    }
  }
}

// [N,K] rows into pair panels (attention's K^T on the bf16 dot): each kernel set's vector packer
// against the scalar loop, whole and partial panels, odd K, a row stride past K, a panel range.
TEST(Microkernels, TransposedPairPanelsMatchScalar) {
  for (const k::KernelSet* set : testing::runnable_sets()) {
    if (!set->pack_rows_bf16) continue;
    const k::KernelSet& ks = *set;
    for (DType dt : {DType::kF32, DType::kBF16}) {
      for (const auto& [K, N, ld] : {std::tuple<int64_t, int64_t, int64_t>{128, 256, 0},
                                     {33, 70, 0},
                                     {1, 5, 3},
                                     {64, ks.nr + 1, 100}}) {
        const int64_t rows_ld = ld == 0 ? K : ld, panels = (N + ks.nr - 1) / ks.nr;
        Tensor src = Tensor::randn({N * rows_ld}, dt, fresh_seed());
        for (const auto& [p0, p1] :
             {std::pair<int64_t, int64_t>{0, panels}, {panels - 1, panels}}) {
          // One element past the panels: both packers write [0, n) only.
          const size_t n = static_cast<size_t>(k::panel_elems(K, true, ks.nr) * (p1 - p0));
          std::vector<uint32_t> want(n + 1, 7), got(n + 1, 7);
          k::pack_panels_bf16(src.data(), dt == DType::kBF16, true, K, N, ks.nr, want.data(), p0,
                              p1, ld);
          k::pack_panels(ks, true, src.data(), dt == DType::kBF16, true, K, N, got.data(), p0, p1,
                         ld);
          EXPECT_EQ(got, want) << dtype_name(dt) << " K=" << K << " N=" << N << " ld=" << ld
                               << " panels " << p0 << ".." << p1 << " on " << ks.name;
        }
      }
    }
  }
}

TEST(Microkernels, VectorBf16WeightPackingMatchesScalar) {
  for (const k::KernelSet* ks : testing::runnable_sets()) {
    if (!ks->pack_b_bf16) continue;
    for (int64_t K : {1, 2, 7, 16, 33}) {
      for (int64_t N : {int64_t{1}, int64_t{ks->nr} + 3, int64_t{3 * ks->nr}}) {
        const std::vector<float> f = random_floats(static_cast<size_t>(K * N), true);
        std::vector<uint16_t> src(f.size());
        for (size_t i = 0; i < f.size(); ++i) src[i] = f32_to_bf16(f[i]);
        const int64_t panels = (N + ks->nr - 1) / ks->nr, per = (K + 1) / 2 * ks->nr;
        std::vector<uint32_t> want(static_cast<size_t>(panels * per), 1),
            got(static_cast<size_t>(panels * per), 2);
        k::pack_panels_bf16(src.data(), true, false, K, N, ks->nr, want.data(), 0, panels);
        ks->pack_b_bf16(src.data(), K, N, N, ks->nr, got.data(), 0, panels);
        EXPECT_EQ(got, want) << ks->name << " K=" << K << " N=" << N;
        // A column block of a wider matrix (row stride ld > N), from its third column.
        if (K * N >= 3 + N) {
          const int64_t ld = N + 1, rows = (static_cast<int64_t>(src.size()) - 2) / ld;
          if (rows >= 1) {
            std::fill(got.begin(), got.end(), 2u);
            std::fill(want.begin(), want.end(), 1u);
            k::pack_panels_bf16(src.data() + 2, true, false, rows, N, ks->nr, want.data(), 0,
                                panels, ld);
            ks->pack_b_bf16(src.data() + 2, rows, N, ld, ks->nr, got.data(), 0, panels);
            const size_t used = static_cast<size_t>(panels * ((rows + 1) / 2) * ks->nr);
            EXPECT_TRUE(std::equal(got.begin(), got.begin() + used, want.begin()))
                << ks->name << " K=" << rows << " N=" << N << " ld=" << ld;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace tokamax

namespace tokamax {
namespace {

// The softmax's row loops of every ISA: exp within a few ulp of double precision (of the f32
// argument: x * scale rounded, less the shift), exactly 0 for -inf and far below, the sum of what
// was stored, for scale 1 and another; scale_max's max and stores; max's max, nothing written;
// every length up to 9 vectors (max's loop takes 4 at a time), nothing read or written past n.
TEST(Microkernels, SoftmaxRowLoops) {
  for (const kernels::KernelSet* ks : testing::runnable_sets()) {
    const kernels::RowKernels rk = kernels::row_kernels(ks->isa);
    for (int64_t n = 0; n <= 140; ++n) {
      Tensor t = Tensor::uniform({n + 1}, DType::kF32, fresh_seed(), -90.0, 12.0);
      std::vector<float> x(t.data_as<float>(), t.data_as<float>() + n + 1);
      if (n > 2) x[1] = -INFINITY;
      x[n] = 1e30f;  // past the row: a max that read it would return it, an exp would change it
      for (const float scale : {1.0f, 0.7f}) {
        std::vector<float> y = x;
        const float sum = rk.exp_shift_sum(y.data(), n, scale, 1.5f);
        double want_sum = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float prod = x[i] * scale;
          const float arg = prod - 1.5f;
          const double want = std::exp(static_cast<double>(arg));
          if (arg <= -87.0f) {
            ASSERT_EQ(y[i], 0.0f) << ks->name << " n=" << n << " x=" << x[i];
          } else {
            ASSERT_NEAR(y[i], want, 4e-7 * want)
                << ks->name << " n=" << n << " x=" << x[i] << " scale=" << scale;
          }
          want_sum += y[i];
        }
        ASSERT_EQ(y[n], x[n]) << ks->name << ": wrote past n";
        ASSERT_NEAR(sum, want_sum, 1e-5 * (1 + want_sum)) << ks->name << " n=" << n;
      }
      std::vector<float> z = x;
      const float mx = rk.scale_max(z.data(), n, 0.25f);
      float want_max = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(z[i], x[i] * 0.25f);
        want_max = std::max(want_max, z[i]);
      }
      ASSERT_EQ(mx, want_max) << ks->name << " n=" << n;
      const std::vector<float> before = x;
      const float raw = rk.max(x.data(), n);
      ASSERT_EQ(x, before) << ks->name << ": max wrote";
      ASSERT_EQ(raw * 0.25f, want_max) << ks->name << " n=" << n;
      ASSERT_EQ(z[n], x[n]);
    }
  }
}

}  // namespace
}  // namespace tokamax

namespace tokamax {
namespace {

// The activation and its derivative in double: an independent formula per activation (not
// kernels::activation_grad, which the portable loop itself calls). 1 - sigmoid(x) as
// sigmoid(-x): no cancellation in the tails.
std::pair<double, double> activation_and_grad(Activation act, double x) {
  const double sig = 1.0 / (1.0 + std::exp(-x)), sig_c = 1.0 / (1.0 + std::exp(x));
  switch (act) {
    case Activation::kNone:
      return {x, 1};
    case Activation::kRelu:
      return {x > 0 ? x : 0, x > 0 ? 1 : 0};
    case Activation::kSilu:
      return {x * sig, sig + x * sig * sig_c};
    case Activation::kGelu: {
      const double cdf = 0.5 * (1 + std::erf(x / std::sqrt(2.0)));
      return {x * cdf, cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI)};
    }
    case Activation::kGeluTanh: {  // 0.5 (1 + tanh(z)) = S = sigmoid(2z), 1 - tanh^2 = 4 S (1 - S)
      const double c = std::sqrt(2 / M_PI), z2 = 2 * c * (x + 0.044715 * x * x * x);
      const double S = 1.0 / (1.0 + std::exp(-z2)), S_c = 1.0 / (1.0 + std::exp(z2));
      return {x * S, S + 2 * x * S * S_c * c * (1 + 3 * 0.044715 * x * x)};
    }
    case Activation::kSigmoid:
      return {sig, sig * sig_c};
  }
  return {x, 1};
}

// The GLU row loops' cases: every runnable ISA, every activation, every length n up to 3
// vectors; g of n + 1 values uniform in [-30, 30) with NaN at 2 and -200 (exp(-x) beyond the
// float range) at 4 where n allows, u uniform in [-2, 2). f(ks, rk, act, n, g, u).
template <class F>
void for_each_row_case(F f) {
  const Activation acts[] = {Activation::kNone, Activation::kRelu,     Activation::kSilu,
                             Activation::kGelu, Activation::kGeluTanh, Activation::kSigmoid};
  for (const kernels::KernelSet* ks : testing::runnable_sets()) {
    const kernels::RowKernels rk = kernels::row_kernels(ks->isa);
    for (Activation act : acts) {
      for (int64_t n = 0; n <= 50; ++n) {
        Tensor g = Tensor::uniform({n + 1}, DType::kF32, fresh_seed(), -30.0, 30.0);
        Tensor u = Tensor::uniform({n + 1}, DType::kF32, fresh_seed(), -2.0, 2.0);
        float* gp = g.data_as<float>();
        if (n > 3) gp[2] = std::numeric_limits<float>::quiet_NaN();
        if (n > 5) gp[4] = -200.0f;
        f(*ks, rk, act, n, gp, u.data_as<float>());
      }
    }
  }
}

std::string case_name(const kernels::KernelSet& ks, Activation act, double x) {
  return std::string(ks.name) + " " + std::string(activation_name(act)) + " x=" + std::to_string(x);
}

// The gated linear unit's epilogue loop of every ISA: activation(g) * u within a few ulp of the
// double-precision formula for every activation, NaN kept, nothing written past n.
TEST(Microkernels, ActivationTimesUpRowLoops) {
  for_each_row_case([](const kernels::KernelSet& ks, const kernels::RowKernels& rk, Activation act,
                       int64_t n, float* gp, const float* us) {
    std::vector<float> out(n + 1, 7.0f);
    rk.act_mul(static_cast<int>(act), gp, us, out.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = gp[i], up = us[i];
      const std::string what = case_name(ks, act, x);
      if (std::isnan(x)) {  // NaN through, except relu's (x > 0 ? x : 0) = 0
        if (act == Activation::kRelu)
          ASSERT_EQ(out[i], 0.0f) << what;
        else
          ASSERT_TRUE(std::isnan(out[i])) << what;
        continue;
      }
      const double y = activation_and_grad(act, x).first;
      // Relative, plus f32's step at |x| for the cancellation in gelu's 1 + erf(x) (x << 0).
      ASSERT_NEAR(out[i], y * up, 1e-6 * std::abs(y * up) + 1e-7 * std::abs(x * up)) << what;
    }
    ASSERT_EQ(out[n], 7.0f) << ks.name << ": wrote past n";
  });
}

// The gated linear unit backward's row loop of every ISA: dg = dout u act'(g) and du = dout
// act(g) within a few ulp of double precision for every activation (sigmoid's 1 - s kept where it
// is tiny, g up to 1e20 without NaN), NaN kept, nothing written past n.
TEST(Microkernels, ActivationGradRowLoops) {
  for_each_row_case([](const kernels::KernelSet& ks, const kernels::RowKernels& rk, Activation act,
                       int64_t n, float* gp, const float* us) {
    Tensor go = Tensor::uniform({n + 1}, DType::kF32, fresh_seed(), -2.0, 2.0);
    if (n > 7) gp[6] = 1e20f;  // x^2, x^3 beyond the float range
    if (n > 9) gp[8] = -1e20f;
    if (n > 11) gp[10] = 17.0f;  // sigmoid' = 4e-8: 1 - s must not cancel to 0
    std::vector<float> dg(n + 1, 7.0f), du(n + 1, 7.0f);
    rk.act_grad(static_cast<int>(act), gp, us, go.data_as<float>(), dg.data(), du.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double x = gp[i], up = us[i], o = go.data_as<float>()[i];
      const std::string what = case_name(ks, act, x);
      if (std::isnan(x)) {  // NaN through, except relu's (0 and 0) and none's slope 1
        ASSERT_EQ(std::isnan(dg[i]), act != Activation::kRelu && act != Activation::kNone) << what;
        ASSERT_EQ(std::isnan(du[i]), act != Activation::kRelu) << what;
        continue;
      }
      const auto [y, dy] = activation_and_grad(act, x);
      if (std::abs(x) > 1e3) {  // saturated: finite, the limit's sign and size
        ASSERT_TRUE(std::isfinite(dg[i]) && std::isfinite(du[i])) << what;
        ASSERT_NEAR(dg[i], o * up * dy, 1e-6 * std::abs(o * up) + 1e-30) << what;
        ASSERT_NEAR(du[i], o * y, 1e-6 * std::abs(o * y) + 1e-30) << what;
        continue;
      }
      // Relative (gelu_tanh's also f32's error in its exponent, 2z, itself), plus a step of
      // 1e-6 where derivatives cancel (silu' and gelu's near their zeros, |x| < 8), not
      // beyond: sigmoid'(17) = 4e-8 must hold relatively. 1e-34: a sigmoid below f32's
      // smallest normal (1.2e-38) is 0, times x z' (up to 1e3) in gelu_tanh's derivative.
      const double z2 = 1.6 * std::abs(x + 0.044715 * x * x * x);
      const double rel = 2e-6 + (act == Activation::kGeluTanh ? 2e-7 * z2 : 0.0);
      ASSERT_NEAR(
          dg[i], o * up * dy,
          rel * std::abs(o * up * dy) + (std::abs(x) < 8 ? 1e-6 * std::abs(o * up) : 0) + 1e-34)
          << what;
      ASSERT_NEAR(du[i], o * y, 1e-6 * std::abs(o * y) + 1e-7 * std::abs(x * o)) << what;
    }
    ASSERT_EQ(dg[n], 7.0f) << ks.name << ": wrote past n";
    ASSERT_EQ(du[n], 7.0f) << ks.name << ": wrote past n";
  });
}

}  // namespace
}  // namespace tokamax
