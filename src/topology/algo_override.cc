#include "topology/algo_override.h"

#include <algorithm>
#include <cctype>

namespace loom::topo {
namespace {

// A token with its 1-based column in the spec, for error messages.
struct Tok {
  std::string_view text;
  size_t col;
};

Tok trim(std::string_view s, size_t col) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return {s.substr(b, e - b), col + b};
}

std::vector<Tok> split(Tok t, char sep) {
  std::vector<Tok> out;
  size_t start = 0;
  for (size_t i = 0; i <= t.text.size(); ++i) {
    if (i == t.text.size() || t.text[i] == sep) {
      out.push_back(trim(t.text.substr(start, i - start), t.col + start));
      start = i + 1;
    }
  }
  return out;
}

Status err(size_t col, const std::string& what) {
  return invalid_argument("LOOM_ALGO column " + std::to_string(col) + ": " + what);
}

}  // namespace

Result<uint64_t> parse_size(std::string_view s) {
  if (s.empty()) return invalid_argument("empty size");
  size_t i = 0;
  uint64_t v = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) {
    uint64_t d = static_cast<uint64_t>(s[i] - '0');
    if (v > (UINT64_MAX - d) / 10) return invalid_argument("size '" + std::string(s) + "' overflows");
    v = v * 10 + d;
    ++i;
  }
  if (i == 0) return invalid_argument("size '" + std::string(s) + "' does not start with a number");
  std::string unit;
  for (; i < s.size(); ++i) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
  int shift = 0;
  std::string_view u = unit;
  if (!u.empty() && std::string_view("KMGT").find(u[0]) != std::string_view::npos) {
    shift = 10 * (1 + static_cast<int>(std::string_view("KMGT").find(u[0])));
    u.remove_prefix(1);
    if (u == "IB") u = "";
  }
  if (u == "B") u = "";
  if (!u.empty()) return invalid_argument("size '" + std::string(s) + "' has an unknown unit (use K, M, G, T)");
  if (shift > 0 && v > (UINT64_MAX >> shift)) return invalid_argument("size '" + std::string(s) + "' overflows");
  return v << shift;
}

std::string format_size(uint64_t bytes) {
  const char* units[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && bytes != 0 && bytes % 1024 == 0) {
    bytes /= 1024;
    ++u;
  }
  return std::to_string(bytes) + units[u];
}

std::optional<AlgoKind> AlgoOverride::lookup(Collective coll, uint64_t bytes) const {
  for (const AlgoRule& r : rules) {
    if (r.coll == coll && bytes >= r.lo && bytes < r.hi) return r.algo;
  }
  return std::nullopt;
}

std::string AlgoOverride::to_string() const {
  std::string out;
  for (size_t i = 0; i < rules.size(); ++i) {
    const AlgoRule& r = rules[i];
    bool same = i > 0 && rules[i - 1].coll == r.coll;
    out += same ? "," : (i > 0 ? ";" : "");
    if (!same) out += std::string(collective_name(r.coll)) + ":";
    out += format_size(r.lo) + "-" + (r.hi == UINT64_MAX ? "" : format_size(r.hi)) + ":" + algo_name(r.algo);
  }
  return out;
}

Result<AlgoOverride> parse_algo_override(std::string_view spec) {
  AlgoOverride ov;
  if (spec.size() > 4096) return err(1, "specification longer than 4096 characters");
  for (const Tok& entry : split(Tok{spec, 1}, ';')) {
    if (entry.text.empty()) continue;  // "a;;b" and a trailing ';' are harmless
    size_t colon = entry.text.find(':');
    if (colon == std::string_view::npos) {
      return err(entry.col, "expected 'collective:algorithm' in '" + std::string(entry.text) + "'");
    }
    Tok cname = trim(entry.text.substr(0, colon), entry.col);
    auto coll = parse_collective(cname.text);
    if (!coll) {
      return err(cname.col, "unknown collective '" + std::string(cname.text) +
                                "' (allreduce, reduce_scatter, all_gather, broadcast, reduce, all_to_all, sendrecv)");
    }
    Tok body = trim(entry.text.substr(colon + 1), entry.col + colon + 1);
    if (body.text.empty()) return err(body.col, "no algorithm after '" + std::string(cname.text) + ":'");
    for (const Tok& item : split(body, ',')) {
      if (item.text.empty()) return err(item.col, "empty item");
      AlgoRule rule;
      rule.coll = *coll;
      Tok algo = item;
      size_t c2 = item.text.rfind(':');
      if (c2 != std::string_view::npos) {
        Tok range = trim(item.text.substr(0, c2), item.col);
        algo = trim(item.text.substr(c2 + 1), item.col + c2 + 1);
        size_t dash = range.text.find('-');
        if (dash == std::string_view::npos) {
          return err(range.col, "range '" + std::string(range.text) + "' needs a '-' (e.g. 0-64K or 64K-)");
        }
        Tok lo = trim(range.text.substr(0, dash), range.col);
        Tok hi = trim(range.text.substr(dash + 1), range.col + dash + 1);
        if (!lo.text.empty()) {
          auto v = parse_size(lo.text);
          if (!v.is_ok()) return err(lo.col, v.status().message());
          rule.lo = v.value();
        }
        if (!hi.text.empty()) {
          auto v = parse_size(hi.text);
          if (!v.is_ok()) return err(hi.col, v.status().message());
          rule.hi = v.value();
        }
        if (rule.lo >= rule.hi) return err(range.col, "empty range '" + std::string(range.text) + "' (low >= high)");
      }
      if (algo.text.empty()) return err(algo.col, "missing algorithm name");
      auto a = parse_algo(algo.text, *coll);
      if (!a) return err(algo.col, "unknown algorithm '" + std::string(algo.text) + "'");
      if (!algo_supports(*a, *coll)) {
        return err(algo.col, std::string("algorithm '") + algo_name(*a) + "' cannot run " + collective_name(*coll));
      }
      rule.algo = *a;
      for (const AlgoRule& r : ov.rules) {
        if (r.coll == rule.coll && rule.lo < r.hi && r.lo < rule.hi) {
          return err(item.col, std::string("range of '") + std::string(item.text) + "' overlaps an earlier rule for " +
                                   collective_name(*coll));
        }
      }
      ov.rules.push_back(rule);
    }
  }
  std::stable_sort(ov.rules.begin(), ov.rules.end(), [](const AlgoRule& a, const AlgoRule& b) {
    return a.coll != b.coll ? a.coll < b.coll : a.lo < b.lo;
  });
  return ov;
}

}  // namespace loom::topo
