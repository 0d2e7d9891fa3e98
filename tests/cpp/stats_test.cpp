// Each struct of stats.hpp lists every field of its own in fields(), once (the Python bindings make
// stats()'s dict from these tables alone; tests/python/test_stats_names.py checks the names).
#include <cstddef>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

#include "prestage/stats.hpp"

namespace prestage {
namespace {

// Converts to any type: T{Any, Any, ...} with n of them compiles for n up to the number of T's
// fields (an aggregate's members are initialised in order), and not for one more.
struct Any {
  template <typename T>
  operator T() const;  // only named in unevaluated contexts, never called
};

template <typename T, typename... Given>
constexpr size_t field_count() {
  if constexpr (requires { T{std::declval<Given>()..., Any{}}; }) {
    return field_count<T, Given..., Any>();
  } else {
    return sizeof...(Given);
  }
}

// What a table lists: its entries, the distinct members they name (each found by its offset in a
// value of the struct), and its names, unique or not.
struct Listed {
  size_t entries = 0;
  size_t members = 0;
  size_t names = 0;
};

template <typename T>
Listed listed() {
  const T value{};
  const auto* base = reinterpret_cast<const std::byte*>(&value);
  std::set<std::ptrdiff_t> offsets;
  std::set<std::string> names;
  size_t entries = 0;
  std::apply(
      [&](const auto&... f) {
        ((offsets.insert(reinterpret_cast<const std::byte*>(&(value.*(f.member))) - base),
          names.insert(f.name), ++entries),
         ...);
      },
      T::fields());
  return {entries, offsets.size(), names.size()};
}

TEST_CASE("stats: the field counter counts an aggregate's members, whatever their types") {
  struct Three {
    std::string a;
    StageStats b;
    std::vector<int> c;
  };
  static_assert(field_count<Three>() == 3);
  static_assert(field_count<StageStats>() == 4);
}

TEST_CASE("stats: every struct's table lists each of its fields once, under a name of its own") {
  // Each member listed (as many distinct members as the struct has), each name once; one member
  // listed twice: Stats::missed_bytes, also under its former name bytes_from_source.
  const auto check = [](const char* name, const Listed& l, size_t fields, size_t aliases) {
    INFO(std::string(name));
    CHECK(l.members == fields);
    CHECK(l.entries == fields + aliases);
    CHECK(l.names == l.entries);
  };
  check("StageStats", listed<StageStats>(), field_count<StageStats>(), 0);
  check("EpochStats", listed<EpochStats>(), field_count<EpochStats>(), 0);
  check("SkippedSample", listed<SkippedSample>(), field_count<SkippedSample>(), 0);
  check("SourceStats", listed<SourceStats>(), field_count<SourceStats>(), 0);
  check("Stats::Tuning", listed<Stats::Tuning>(), field_count<Stats::Tuning>(), 0);
  check("Stats::Memory", listed<Stats::Memory>(), field_count<Stats::Memory>(), 0);
  check("Stats::GpuDecode", listed<Stats::GpuDecode>(), field_count<Stats::GpuDecode>(), 0);
  check("Stats", listed<Stats>(), field_count<Stats>(), 1);
}

}  // namespace
}  // namespace prestage
