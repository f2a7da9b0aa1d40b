#include "topology/xml.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <fstream>

namespace loom::topo {

const std::string* XmlElement::attr(std::string_view key) const {
  for (const auto& [k, v] : attrs) {
    if (k == key) return &v;
  }
  return nullptr;
}

void XmlElement::set_attr(std::string_view key, std::string value) {
  for (auto& [k, v] : attrs) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  attrs.emplace_back(std::string(key), std::move(value));
}

namespace {

bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
}
bool is_name_char(char c) {
  return is_name_start(c) || (c >= '0' && c <= '9') || c == '-' || c == '.';
}
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class Parser {
 public:
  Parser(std::string_view text, const XmlLimits& limits) : s_(text), limits_(limits) {}

  Result<XmlElement> parse_document() {
    if (s_.size() > limits_.max_bytes) {
      return invalid_argument("XML input is " + std::to_string(s_.size()) +
                              " bytes, over the limit of " + std::to_string(limits_.max_bytes));
    }
    LOOM_RETURN_IF_ERROR(skip_misc());
    if (at_end()) return error("no root element");
    if (peek() != '<') return error("expected '<' at the start of the root element");
    XmlElement root;
    LOOM_RETURN_IF_ERROR(parse_element(root, 1));
    LOOM_RETURN_IF_ERROR(skip_misc());
    if (!at_end()) return error("content after the root element");
    return root;
  }

 private:
  bool at_end() const { return pos_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
  bool starts_with(std::string_view p) const { return s_.substr(pos_, p.size()) == p; }
  void advance(size_t n = 1) {
    for (size_t i = 0; i < n && pos_ < s_.size(); ++i) {
      if (s_[pos_] == '\n') ++line_;
      ++pos_;
    }
  }
  Status error(const std::string& what) const {
    return invalid_argument("line " + std::to_string(line_) + ": " + what);
  }
  void skip_space() {
    while (!at_end() && is_space(peek())) advance();
  }

  // Skips whitespace, comments, processing instructions and text content.
  Status skip_misc() {
    for (;;) {
      skip_space();
      if (at_end()) return Status::ok();
      if (starts_with("<!--")) {
        LOOM_RETURN_IF_ERROR(skip_until("-->", "unterminated comment"));
      } else if (starts_with("<?")) {
        LOOM_RETURN_IF_ERROR(skip_until("?>", "unterminated processing instruction"));
      } else if (starts_with("<!")) {
        return error("DOCTYPE, CDATA and other declarations are not supported");
      } else {
        return Status::ok();
      }
    }
  }
  Status skip_until(std::string_view end, const char* what) {
    const int start_line = line_;
    size_t found = s_.find(end, pos_);
    if (found == std::string_view::npos) {
      return invalid_argument("line " + std::to_string(start_line) + ": " + what);
    }
    advance(found + end.size() - pos_);
    return Status::ok();
  }

  Status parse_name(std::string& out) {
    if (at_end() || !is_name_start(peek())) return error("expected a name");
    size_t start = pos_;
    while (!at_end() && is_name_char(peek())) advance();
    if (pos_ - start > limits_.max_name_len) return error("name longer than " + std::to_string(limits_.max_name_len));
    out.assign(s_.substr(start, pos_ - start));
    return Status::ok();
  }

  Status decode_entity(std::string& out) {
    // At '&'.
    size_t semi = s_.find(';', pos_);
    if (semi == std::string_view::npos || semi - pos_ > 12) return error("malformed character reference");
    std::string_view ent = s_.substr(pos_ + 1, semi - pos_ - 1);
    if (ent == "lt") out += '<';
    else if (ent == "gt") out += '>';
    else if (ent == "amp") out += '&';
    else if (ent == "quot") out += '"';
    else if (ent == "apos") out += '\'';
    else if (ent.size() >= 2 && ent[0] == '#') {
      unsigned long code = 0;
      bool hex = ent[1] == 'x' || ent[1] == 'X';
      std::string_view digits = ent.substr(hex ? 2 : 1);
      if (digits.empty()) return error("empty character reference");
      for (char c : digits) {
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (hex && c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (hex && c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return error("bad digit in character reference");
        code = code * (hex ? 16 : 10) + static_cast<unsigned long>(d);
        if (code > 0x10FFFF) return error("character reference out of range");
      }
      if (code == 0 || code > 0x7F) return error("only ASCII character references are supported");
      out += static_cast<char>(code);
    } else {
      return error("unknown entity '&" + std::string(ent) + ";'");
    }
    advance(semi + 1 - pos_);
    return Status::ok();
  }

  Status parse_attr_value(std::string& out) {
    char quote = peek();
    if (quote != '"' && quote != '\'') return error("attribute value must be quoted");
    advance();
    for (;;) {
      if (at_end()) return error("unterminated attribute value");
      char c = peek();
      if (c == quote) {
        advance();
        return Status::ok();
      }
      if (c == '<') return error("'<' inside an attribute value");
      if (c == '&') {
        LOOM_RETURN_IF_ERROR(decode_entity(out));
      } else {
        out += c;
        advance();
      }
      if (out.size() > limits_.max_value_len) {
        return error("attribute value longer than " + std::to_string(limits_.max_value_len));
      }
    }
  }

  Status parse_element(XmlElement& el, int depth) {
    if (depth > limits_.max_depth) {
      return error("elements nested deeper than " + std::to_string(limits_.max_depth));
    }
    if (++elements_ > limits_.max_elements) {
      return error("more than " + std::to_string(limits_.max_elements) + " elements");
    }
    el.line = line_;
    advance();  // '<'
    LOOM_RETURN_IF_ERROR(parse_name(el.name));
    for (;;) {
      const size_t before = pos_;
      skip_space();
      if (at_end()) return error("unterminated start tag <" + el.name + ">");
      if (starts_with("/>")) {
        advance(2);
        return Status::ok();
      }
      if (peek() == '>') {
        advance();
        break;
      }
      if (before == pos_) return error("expected whitespace before attribute in <" + el.name + ">");
      std::string key, value;
      LOOM_RETURN_IF_ERROR(parse_name(key));
      skip_space();
      if (peek() != '=') return error("expected '=' after attribute '" + key + "'");
      advance();
      skip_space();
      LOOM_RETURN_IF_ERROR(parse_attr_value(value));
      if (el.attr(key) != nullptr) return error("duplicate attribute '" + key + "' in <" + el.name + ">");
      if (el.attrs.size() >= limits_.max_attrs) return error("too many attributes in <" + el.name + ">");
      el.attrs.emplace_back(std::move(key), std::move(value));
    }
    // Content.
    for (;;) {
      // Text content is ignored, but it may not contain a stray '&' sequence we cannot decode.
      while (!at_end() && peek() != '<') advance();
      if (at_end()) return error("missing </" + el.name + ">");
      if (starts_with("</")) {
        advance(2);
        std::string close;
        LOOM_RETURN_IF_ERROR(parse_name(close));
        skip_space();
        if (peek() != '>') return error("expected '>' in end tag </" + close + ">");
        advance();
        if (close != el.name) {
          return error("end tag </" + close + "> does not match <" + el.name + "> opened on line " +
                       std::to_string(el.line));
        }
        return Status::ok();
      }
      if (starts_with("<!--")) {
        LOOM_RETURN_IF_ERROR(skip_until("-->", "unterminated comment"));
        continue;
      }
      if (starts_with("<?")) {
        LOOM_RETURN_IF_ERROR(skip_until("?>", "unterminated processing instruction"));
        continue;
      }
      if (starts_with("<!")) return error("DOCTYPE, CDATA and other declarations are not supported");
      el.children.emplace_back();
      LOOM_RETURN_IF_ERROR(parse_element(el.children.back(), depth + 1));
    }
  }

  std::string_view s_;
  XmlLimits limits_;
  size_t pos_ = 0;
  int line_ = 1;
  size_t elements_ = 0;
};

void escape_into(std::string& out, const std::string& v) {
  for (char c : v) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
}

void write_element(std::string& out, const XmlElement& el, int indent) {
  out.append(static_cast<size_t>(indent) * 2, ' ');
  out += '<';
  out += el.name;
  for (const auto& [k, v] : el.attrs) {
    out += ' ';
    out += k;
    out += "=\"";
    escape_into(out, v);
    out += '"';
  }
  if (el.children.empty()) {
    out += "/>\n";
    return;
  }
  out += ">\n";
  for (const auto& c : el.children) write_element(out, c, indent + 1);
  out.append(static_cast<size_t>(indent) * 2, ' ');
  out += "</" + el.name + ">\n";
}

}  // namespace

Result<XmlElement> parse_xml(std::string_view text, const XmlLimits& limits) {
  Parser p(text, limits);
  return p.parse_document();
}

Result<XmlElement> read_xml_file(const std::string& path, const XmlLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return system_error("cannot open topology file '" + path + "'", errno);
  std::string text;
  char buf[65536];
  while (in.read(buf, sizeof buf) || in.gcount() > 0) {
    text.append(buf, static_cast<size_t>(in.gcount()));
    if (text.size() > limits.max_bytes) {
      return invalid_argument(path + ": file larger than " + std::to_string(limits.max_bytes) + " bytes");
    }
  }
  auto r = parse_xml(text, limits);
  if (!r.is_ok()) return r.status().with_context(path);
  return r;
}

std::string write_xml(const XmlElement& root) {
  std::string out;
  write_element(out, root, 0);
  return out;
}

Status write_xml_file(const std::string& path, const XmlElement& root) {
  std::string text = write_xml(root);
  // Whole file under a name of its own, then renamed over `path`: processes
  // or threads dumping to one path at once each replace it atomically instead
  // of interleaving their bytes in it.
  static std::atomic<unsigned> seq{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(seq.fetch_add(1));
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return system_error("cannot create topology dump '" + tmp + "'", errno);
  size_t n = std::fwrite(text.data(), 1, text.size(), f);
  int close_rc = std::fclose(f);
  if (n != text.size() || close_rc != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return system_error("writing topology dump '" + tmp + "'", err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    std::remove(tmp.c_str());
    return system_error("cannot rename topology dump '" + tmp + "' to '" + path + "'", err);
  }
  return Status::ok();
}

}  // namespace loom::topo
