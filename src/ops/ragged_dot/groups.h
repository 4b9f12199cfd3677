// The ragged group sizes, shared by every grouped matmul family (ragged_dot and
// quantized_ragged_dot): the `group_sizes` argument (a spec gives the sizes, or
// {num_groups, total_size} spread at random), their expansion once lhs gives the rows, and the
// offsets. A Call has group_sizes, representative_group_sizes, key_total_rows, pending_groups,
// offsets, g and lhs.
#pragma once

#include <fmt/format.h>

#include <climits>
#include <cstdint>
#include <string>
#include <vector>

#include "tokamax/core/limits.h"
#include "tokamax/op/family.h"

namespace tokamax::rdot {

// Total rows spread over `groups` uniformly at random with `seed` (tokamax's representative
// distribution).
std::vector<int32_t> generate_group_sizes(int64_t total, int64_t groups, uint64_t seed = 0);

// group_sizes in a spec: the sizes themselves (also the key's representative sizes), or
// {"num_groups": G, "total_size": T}, spread uniformly at random over the groups.
template <class Call>
ArgField<Call> group_sizes_field() {
  return Args<Call>::custom(
      "group_sizes",
      [](const Call& c) {
        if (c.representative_group_sizes) return Json(*c.representative_group_sizes);
        return Json{{"num_groups", c.g}, {"total_size", c.key_total_rows}};
      },
      [](Call& c, const Json& j) {
        if (j.is_array()) {
          if (static_cast<int64_t>(j.size()) > kMaxSpecGroups) {
            throw InvalidArgument(fmt::format("a list of {} group sizes; expected at most {}",
                                              j.size(), kMaxSpecGroups));
          }
          for (size_t i = 0; i < j.size(); ++i) {
            const Json& x = j[i];
            // Checked as the 64-bit value it is: get<int32_t> wrapped 2^32 + 1 to 1, another key.
            if (!json_integer_in(x, INT32_MIN, INT32_MAX)) {
              throw InvalidArgument(fmt::format(
                  "group size #{} = {}; expected an integer in [0, {}]", i, x.dump(), INT32_MAX));
            }
            c.group_sizes.push_back(static_cast<int32_t>(x.get<int64_t>()));
          }
          c.representative_group_sizes = c.group_sizes;
          return;
        }
        const auto count = [&](const char* name, int64_t limit) {
          const auto it = j.is_object() ? j.find(name) : j.end();
          if (it == j.end() || !it->is_number_integer() ||
              (!it->is_number_unsigned() && it->get<int64_t>() < 0))
            throw InvalidArgument(
                "expected a list of ints or {\"num_groups\": G, \"total_size\": M} (G, M >= 0)");
          if (it->get<uint64_t>() > static_cast<uint64_t>(limit)) {
            throw InvalidArgument(
                fmt::format("{} = {}; expected at most {}", name, it->dump(), limit));
          }
          return it->get<int64_t>();
        };
        const int64_t groups = count("num_groups", kMaxSpecGroups),
                      total = count("total_size", kMaxSpecGroupTotal);
        c.pending_groups = groups;
        c.key_total_rows = total;
      },
      [](const Call& c, Signature& sig) {
        if (c.representative_group_sizes) {
          sig.push_back(-1);
          sig.push_back(static_cast<int64_t>(c.representative_group_sizes->size()));
          sig.insert(sig.end(), c.representative_group_sizes->begin(),
                     c.representative_group_sizes->end());
        }
        sig.push_back(-2);
        sig.push_back(c.g);
        sig.push_back(c.key_total_rows);
      });
}

// A {num_groups, total_size} spec's sizes are only generated here, once lhs gives the M rows
// they must fit in.
template <class Call>
void expand_pending_groups(Call& c, int64_t M, const char* op) {
  if (c.pending_groups < 0) return;
  if (c.key_total_rows > M) {
    throw InvalidArgument(
        fmt::format("{}: group_sizes total_size = {} exceeds the {} rows of lhs {}", op,
                    c.key_total_rows, M, c.lhs.spec().str()));
  }
  c.group_sizes = generate_group_sizes(c.key_total_rows, c.pending_groups, 0);
  c.pending_groups = -1;
}

// Sizes from a caller are unchecked until here: negative ones, or more rows than lhs has,
// would send the kernels outside lhs.
template <class Call>
void bind_offsets(Call& c, int64_t M, int64_t G, const char* op) {
  c.offsets.assign(static_cast<size_t>(G) + 1, 0);
  for (int64_t g = 0; g < G; ++g) {
    if (c.group_sizes[g] < 0) {
      throw InvalidArgument(
          fmt::format("{}: group_sizes[{}] = {}; expected >= 0", op, g, c.group_sizes[g]));
    }
    c.offsets[g + 1] = c.offsets[g] + c.group_sizes[g];
  }
  if (c.offsets[G] > M) {
    throw InvalidArgument(fmt::format("{}: sum(group_sizes) = {} exceeds the {} rows of lhs {}", op,
                                      c.offsets[G], M, c.lhs.spec().str()));
  }
}

}  // namespace tokamax::rdot
