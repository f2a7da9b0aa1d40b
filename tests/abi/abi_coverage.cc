// Checks that abi_items.h names everything NVIDIA's nccl.h defines: every
// macro, enum constant, typedef name, struct field and function. Without it
// the ABI comparison would only be as complete as a hand-written list.
// Usage: abi_coverage REAL_NCCL_H ABI_ITEMS_H
#include <cstdio>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string strip_comments(const std::string& s) {
  static const std::regex block(R"(/\*[\s\S]*?\*/)");
  static const std::regex line(R"(//[^\n]*)");
  return std::regex_replace(std::regex_replace(s, block, " "), line, " ");
}

void collect(const std::string& text, const std::regex& re, int group, std::set<std::string>* out) {
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it)
    out->insert((*it)[group].str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s REAL_NCCL_H ABI_ITEMS_H\n", argv[0]);
    return 2;
  }
  const std::string real = strip_comments(read_file(argv[1]));
  const std::string items = read_file(argv[2]);
  if (real.empty() || items.empty()) {
    std::fprintf(stderr, "cannot read %s or %s\n", argv[1], argv[2]);
    return 2;
  }

  std::set<std::string> names;
  collect(real, std::regex(R"(#define\s+(NCCL_\w+))"), 1, &names);
  collect(real, std::regex(R"(\b(nccl\w+)\s*=)"), 1, &names);               // enum constants
  collect(real, std::regex(R"(\}\s*(\w+)\s*;)"), 1, &names);                 // typedef'd structs/enums
  collect(real, std::regex(R"(typedef\s+struct\s+\w+\s*\*\s*(\w+)\s*;)"), 1, &names);  // handles
  collect(real, std::regex(R"(\b(p?nccl\w+)\s*\()"), 1, &names);             // functions
  // Struct fields: members of every struct body.
  std::regex body(R"(struct\s*\w*\s*\{([^}]*)\})");
  for (std::sregex_iterator it(real.begin(), real.end(), body), end; it != end; ++it) {
    std::string members = (*it)[1].str();
    collect(members, std::regex(R"((\w+)\s*(\[[^\]]*\])?\s*;)"), 1, &names);
  }
  names.erase("NCCL_H_");  // include guard, not ABI

  std::set<std::string> words;
  collect(items, std::regex(R"(\w+)"), 0, &words);
  int missing = 0;
  for (const std::string& n : names) {
    if (words.count(n) == 0) {
      std::fprintf(stderr, "not covered by abi_items.h: %s\n", n.c_str());
      ++missing;
    }
  }
  std::printf("abi_coverage: %zu names in the real header, %d not covered\n", names.size(), missing);
  return missing == 0 && names.size() > 100 ? 0 : 1;
}
