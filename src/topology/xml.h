// A small, bounded XML reader and writer for NCCL-style topology files.
//
// Why our own: topology files use a tiny subset of XML (elements, attributes,
// comments, an optional <?xml?> declaration) and must be read safely from
// untrusted paths (LOOM_TOPO_FILE). A hand-sized parser lets every error name
// its line and enforces hard limits (size, depth, element count) so hostile
// input ends in a Status, never a crash or unbounded recursion.
//
// Not supported (rejected with an error): DOCTYPE/DTDs, CDATA, non-ASCII
// character references. Text content between elements is ignored.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/status.h"

namespace loom::topo {

struct XmlElement {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;  // in file order
  std::vector<XmlElement> children;
  int line = 0;  // 1-based line of the opening '<'; 0 for built elements

  // Returns the attribute value or nullptr when absent.
  const std::string* attr(std::string_view key) const;
  // Replaces an existing attribute or appends a new one.
  void set_attr(std::string_view key, std::string value);
};

struct XmlLimits {
  size_t max_bytes = 16u << 20;
  int max_depth = 32;
  size_t max_elements = 100000;
  size_t max_attrs = 64;
  size_t max_name_len = 128;
  size_t max_value_len = 4096;
};

// Parses a document with exactly one root element. Errors are
// kInvalidArgument with a message of the form "line N: what".
Result<XmlElement> parse_xml(std::string_view text, const XmlLimits& limits = {});
Result<XmlElement> read_xml_file(const std::string& path, const XmlLimits& limits = {});

// Serializes with two-space indentation; attribute values are escaped.
std::string write_xml(const XmlElement& root);
Status write_xml_file(const std::string& path, const XmlElement& root);

}  // namespace loom::topo
