// Lexer and parser of the chat-template language (a Jinja2 subset; see template.h).
//
// Whitespace handling follows Jinja's lexer with trim_blocks and lstrip_blocks:
//  * `{%-` / `{#-` / `{{-` strip all whitespace before the tag; `-%}` / `-#}` / `-}}` after it;
//  * trim_blocks drops one newline right after `%}` or `#}` (not after `}}`, not after `+%}`);
//  * lstrip_blocks removes the whitespace between a line start and `{%` / `{#` (not `{{`,
//    not `{%+`), where "line start" is a newline in the text or the end of the previous tag;
//  * newlines are normalised to \n and one trailing newline of the source is dropped.
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "text/template.h"
#include "text/template_ast.h"

namespace atlas::tmpl {
namespace {

struct Tok {
  enum T { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, Int, Float, String, Op, Eof };
  T t;
  std::string s;  // text, name, string value or operator
  int64_t i = 0;
  double f = 0;
  size_t pos = 0;  // offset in the normalised source
};

class Lexer {
 public:
  Lexer(std::string src, const std::string& name, const TemplateOptions& opt)
      : src_(std::move(src)), name_(name), opt_(opt) {}

  const std::string& source() const { return src_; }

  [[noreturn]] void error_at(size_t pos, const std::string& what) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) {
        ++col;
      }
    }
    fail(name_, "line " + std::to_string(line) + ", column " + std::to_string(col), what);
  }

  std::vector<Tok> run() {
    std::vector<Tok> out;
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t at = find_tag(pos);
      std::string text = src_.substr(pos, (at == std::string::npos ? src_.size() : at) - pos);
      if (at == std::string::npos) {
        if (!text.empty()) out.push_back({Tok::Text, text, 0, 0, pos});
        break;
      }
      char kind = src_[at + 1];
      char sign = at + 2 < src_.size() && (src_[at + 2] == '-' || src_[at + 2] == '+') ? src_[at + 2] : 0;
      if (sign == '-') {
        text = rstrip_space(text);
      } else if (sign != '+' && opt_.lstrip_blocks && kind != '{') {
        size_t lpos = text.rfind('\n');
        lpos = lpos == std::string::npos ? 0 : lpos + 1;
        if ((lpos > 0 || line_starting) && lpos < text.size() && all_space(text.substr(lpos)))
          text.resize(lpos);
      }
      if (!text.empty()) out.push_back({Tok::Text, text, 0, 0, pos});
      size_t body = at + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        size_t end = src_.find("#}", body);
        if (end == std::string::npos) error_at(at, "unterminated comment (missing '#}')");
        pos = after_end(end, end + 2, '#');
      } else if (kind == '%' && is_raw(body)) {
        pos = lex_raw(at, body, out);
      } else {
        out.push_back({kind == '%' ? Tok::BlockBegin : Tok::VarBegin, {}, 0, 0, at});
        pos = lex_tag(body, kind, out);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    out.push_back({Tok::Eof, {}, 0, 0, src_.size()});
    return out;
  }

 private:
  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  static std::string rstrip_space(const std::string& s) {
    auto cps = utf8_decode(s);
    while (!cps.empty() && py_isspace(cps.back())) cps.pop_back();
    return utf8_encode(cps);
  }
  static bool all_space(const std::string& s) {
    for (char32_t c : utf8_decode(s))
      if (!py_isspace(c)) return false;
    return true;
  }
  // Skips Python whitespace from pos.
  size_t skip_space(size_t pos) const {
    while (pos < src_.size()) {
      size_t n = 1;
      unsigned char c = static_cast<unsigned char>(src_[pos]);
      if (c >= 0x80) n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (!py_isspace(utf8_decode(std::string_view(src_).substr(pos, n))[0])) break;
      pos += n;
    }
    return pos;
  }

  // `end` is where the closing marker starts (its '-'/'+' sign, if any, sits just before it).
  // Returns the position after the tag, with trim_blocks / `-` stripping applied.
  size_t after_end(size_t end, size_t past, char kind) const {
    char sign = end > 0 && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    if (sign == '-') return skip_space(past);
    if (sign != '+' && kind != '{' && opt_.trim_blocks && past < src_.size() && src_[past] == '\n') return past + 1;
    return past;
  }

  bool is_raw(size_t body) const {
    size_t p = skip_space(body);
    if (src_.compare(p, 3, "raw") != 0) return false;
    p = skip_space(p + 3);
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  size_t lex_raw(size_t at, size_t body, std::vector<Tok>& out) {
    size_t p = skip_space(body) + 3;
    p = skip_space(p);
    size_t start = after_end(p + (src_[p] == '-' ? 1 : 0), p + (src_[p] == '-' ? 3 : 2), '%');
    for (size_t q = src_.find("{%", start); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      char sign = r < src_.size() && (src_[r] == '-' || src_[r] == '+') ? src_[r] : 0;
      if (sign) ++r;
      r = skip_space(r);
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r = skip_space(r + 6);
      bool minus = r < src_.size() && src_[r] == '-';
      if (src_.compare(r + (minus ? 1 : 0), 2, "%}") != 0) continue;
      std::string text = src_.substr(start, q - start);
      if (sign == '-') text = rstrip_space(text);
      if (!text.empty()) out.push_back({Tok::Text, text, 0, 0, start});
      size_t e = r + (minus ? 1 : 0);
      return after_end(e, e + 2, '%');
    }
    error_at(at, "unterminated raw block (missing '{% endraw %}')");
  }

  size_t lex_tag(size_t p, char kind, std::vector<Tok>& out) {
    const char* end_mark = kind == '%' ? "%}" : "}}";
    int depth = 0;  // open brackets: Jinja ignores a closing marker inside them
    size_t begin = p;
    for (;;) {
      p = skip_space(p);
      if (p >= src_.size()) error_at(begin - 2, std::string("unterminated tag (missing '") + end_mark + "')");
      if (depth == 0) {
        if (src_[p] == '-' && src_.compare(p + 1, 2, end_mark) == 0) {
          out.push_back({kind == '%' ? Tok::BlockEnd : Tok::VarEnd, {}, 0, 0, p});
          return after_end(p + 1, p + 3, kind);
        }
        if (src_[p] == '+' && kind == '%' && src_.compare(p + 1, 2, end_mark) == 0) {
          out.push_back({Tok::BlockEnd, {}, 0, 0, p});
          return after_end(p + 1, p + 3, kind);
        }
        if (src_.compare(p, 2, end_mark) == 0) {
          out.push_back({kind == '%' ? Tok::BlockEnd : Tok::VarEnd, {}, 0, 0, p});
          return after_end(p, p + 2, kind);
        }
      }
      char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        out.push_back({Tok::Name, src_.substr(p, q - p), 0, 0, p});
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = lex_number(p, out);
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, out);
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "[", "]",
                                    "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};
        const char* m = nullptr;
        for (const char* o : ops)
          if (src_.compare(p, std::strlen(o), o) == 0) {
            m = o;
            break;
          }
        if (!m) error_at(p, std::string("unexpected character '") + c + "'");
        if (*m == '(' || *m == '[' || *m == '{') ++depth;
        if ((*m == ')' || *m == ']' || *m == '}') && depth > 0) --depth;
        out.push_back({Tok::Op, m, 0, 0, p});
        p += std::strlen(m);
      }
    }
  }

  size_t lex_number(size_t p, std::vector<Tok>& out) {
    size_t q = p;
    auto digits = [&] {
      while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) ||
                                 (src_[q] == '_' && q + 1 < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q + 1])))))
        ++q;
    };
    digits();
    bool is_float = false;
    if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      ++q;
      digits();
    }
    if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        q = r;
        digits();
      }
    }
    std::string lit;
    for (size_t i = p; i < q; ++i)
      if (src_[i] != '_') lit += src_[i];
    Tok t{is_float ? Tok::Float : Tok::Int, lit, 0, 0, p};
    try {
      if (is_float)
        t.f = std::stod(lit);
      else
        t.i = std::stoll(lit);
    } catch (const std::exception&) {
      error_at(p, "number out of range: " + lit);
    }
    out.push_back(t);
    return q;
  }

  // Python string literal escapes (Jinja decodes them with "unicode-escape"); an unknown escape
  // keeps its backslash, as Python does.
  size_t lex_string(size_t p, std::vector<Tok>& out) {
    char q = src_[p];
    std::string v;
    size_t i = p + 1;
    auto hex = [&](size_t n) -> char32_t {
      if (i + n > src_.size()) error_at(i, "truncated escape in string literal");
      char32_t c = 0;
      for (size_t k = 0; k < n; ++k) {
        char h = src_[i + k];
        if (!std::isxdigit(static_cast<unsigned char>(h))) error_at(i, "bad escape in string literal");
        c = c * 16 + (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
      }
      i += n;
      return c;
    };
    for (;;) {
      if (i >= src_.size()) error_at(p, "unterminated string literal");
      char c = src_[i];
      if (c == q) break;
      if (c != '\\') {
        v += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) error_at(p, "unterminated string literal");
      char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n': v += '\n'; break;
        case 't': v += '\t'; break;
        case 'r': v += '\r'; break;
        case '\\': v += '\\'; break;
        case '\'': v += '\''; break;
        case '"': v += '"'; break;
        case 'a': v += '\a'; break;
        case 'b': v += '\b'; break;
        case 'f': v += '\f'; break;
        case 'v': v += '\v'; break;
        case '\n': break;
        case 'x': utf8_append(v, hex(2)); break;
        case 'u': utf8_append(v, hex(4)); break;
        case 'U': utf8_append(v, hex(8)); break;
        default:
          if (e >= '0' && e <= '7') {
            char32_t c8 = e - '0';
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k) c8 = c8 * 8 + (src_[i++] - '0');
            utf8_append(v, c8);
          } else {
            v += '\\';
            i -= 1;  // the escaped character is ordinary text (it may start a UTF-8 sequence)
          }
      }
    }
    out.push_back({Tok::String, v, 0, 0, p});
    return i + 1;
  }

  std::string src_;
  const std::string& name_;
  TemplateOptions opt_;
};

// ---- parser -------------------------------------------------------------------------------

class Parser {
 public:
  Parser(const Lexer& lx, std::vector<Tok> toks) : lx_(lx), t_(std::move(toks)) {}

  Body parse_template() {
    std::string end;
    Body b = parse_body({}, end);
    return b;
  }

 private:
  const Tok& cur() const { return t_[i_]; }
  const Tok& peek(size_t k = 1) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  bool is_op(const char* o) const { return cur().t == Tok::Op && cur().s == o; }
  bool is_name(const char* n) const { return cur().t == Tok::Name && cur().s == n; }
  [[noreturn]] void error(const std::string& what) const { lx_.error_at(cur().pos, what); }
  std::string describe(const Tok& t) const {
    switch (t.t) {
      case Tok::Text: return "text";
      case Tok::VarBegin: return "'{{'";
      case Tok::VarEnd: return "end of print statement '}}'";
      case Tok::BlockBegin: return "'{%'";
      case Tok::BlockEnd: return "end of statement block '%}'";
      case Tok::Name: return "name '" + t.s + "'";
      case Tok::Int:
      case Tok::Float: return "number " + t.s;
      case Tok::String: return "string";
      case Tok::Op: return "'" + t.s + "'";
      case Tok::Eof: return "end of template";
    }
    return "?";
  }
  void expect_op(const char* o) {
    if (!is_op(o)) error(std::string("expected '") + o + "', got " + describe(cur()));
    ++i_;
  }
  std::string expect_name() {
    if (cur().t != Tok::Name) error("expected a name, got " + describe(cur()));
    return t_[i_++].s;
  }
  void expect_block_end() {
    if (cur().t != Tok::BlockEnd) error("expected end of statement block '%}', got " + describe(cur()));
    ++i_;
  }
  template <class T>
  std::unique_ptr<T> make(typename T::K k, const Tok& at) {
    auto n = std::make_unique<T>();
    n->k = k;
    lx_pos(at.pos, n->line, n->col);
    return n;
  }
  void lx_pos(size_t pos, int& line, int& col) const {
    line = 1;
    col = 1;
    const std::string& s = lx_.source();
    for (size_t i = 0; i < pos && i < s.size(); ++i) {
      if (s[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) {
        ++col;
      }
    }
  }

  // Parses nodes until `{% X %}` with X in `ends` (consumed up to X; X stored in `found`).
  Body parse_body(const std::vector<std::string>& ends, std::string& found) {
    Body body;
    for (;;) {
      const Tok& t = cur();
      if (t.t == Tok::Eof) {
        if (!ends.empty()) {
          std::string want;
          for (auto& e : ends) want += (want.empty() ? "'" : " or '") + e + "'";
          error("unexpected end of template: expected " + want);
        }
        return body;
      }
      if (t.t == Tok::Text) {
        auto n = make<Node>(Node::K::Text, t);
        n->text = t.s;
        body.push_back(std::move(n));
        ++i_;
      } else if (t.t == Tok::VarBegin) {
        auto n = make<Node>(Node::K::Output, t);
        ++i_;
        n->expr = parse_tuple(true);
        if (cur().t != Tok::VarEnd) error("expected end of print statement '}}', got " + describe(cur()));
        ++i_;
        body.push_back(std::move(n));
      } else if (t.t == Tok::BlockBegin) {
        ++i_;
        if (cur().t != Tok::Name) error("expected a statement name, got " + describe(cur()));
        const std::string& kw = cur().s;
        for (auto& e : ends)
          if (kw == e) {
            found = kw;
            ++i_;
            return body;
          }
        if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") {
          std::string want;
          for (auto& e : ends) want += (want.empty() ? "" : " or ") + std::string("'") + e + "'";
          error("unexpected '" + kw + "'" + (want.empty() ? std::string(" outside of any block") : ", expected " + want));
        }
        body.push_back(parse_statement());
      } else {
        error("unexpected " + describe(t));
      }
    }
  }

  NodePtr parse_statement() {
    const Tok& t = cur();
    const std::string kw = t.s;
    std::string found;
    if (kw == "if") {
      auto n = make<Node>(Node::K::If, t);
      ++i_;
      n->conds.push_back(parse_tuple(true));
      expect_block_end();
      for (;;) {
        n->bodies.push_back(parse_body({"elif", "else", "endif"}, found));
        if (found == "elif") {
          n->conds.push_back(parse_tuple(true));
          expect_block_end();
        } else if (found == "else") {
          expect_block_end();
          n->bodies.push_back(parse_body({"endif"}, found));
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
      return n;
    }
    if (kw == "for") {
      auto n = make<Node>(Node::K::For, t);
      ++i_;
      parse_targets(*n, false);
      if (!is_name("in")) error("expected 'in' in for loop, got " + describe(cur()));
      ++i_;
      n->expr = parse_tuple(false);
      if (is_name("if")) {
        ++i_;
        n->cond = parse_expression(true);
      }
      if (is_name("recursive")) error("recursive for loops are not supported");
      expect_block_end();
      n->bodies.push_back(parse_body({"else", "endfor"}, found));
      if (found == "else") {
        expect_block_end();
        n->bodies.push_back(parse_body({"endfor"}, found));
      }
      expect_block_end();
      return n;
    }
    if (kw == "set") {
      ++i_;
      auto n = make<Node>(Node::K::Set, t);
      parse_targets(*n, true);
      if (is_op("=")) {
        ++i_;
        n->expr = parse_tuple(true);
        expect_block_end();
        return n;
      }
      if (n->tuple_target || !n->attr.empty()) error("block set takes a single name");
      n->k = Node::K::SetBlock;
      parse_filter_chain(*n);
      expect_block_end();
      n->bodies.push_back(parse_body({"endset"}, found));
      expect_block_end();
      return n;
    }
    if (kw == "macro") {
      auto n = make<Node>(Node::K::Macro, t);
      ++i_;
      n->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        n->targets.push_back(expect_name());
        if (is_op("=")) {
          ++i_;
          n->values.push_back(parse_expression(true));
        } else {
          if (!n->values.empty()) error("non-default macro argument follows a default one");
        }
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op(")");
      expect_block_end();
      n->bodies.push_back(parse_body({"endmacro"}, found));
      if (cur().t == Tok::Name) ++i_;  // {% endmacro name %}
      expect_block_end();
      return n;
    }
    if (kw == "filter") {
      auto n = make<Node>(Node::K::FilterBlock, t);
      parse_filter_chain(*n, true);  // starts on the `filter` keyword
      expect_block_end();
      n->bodies.push_back(parse_body({"endfilter"}, found));
      expect_block_end();
      return n;
    }
    if (kw == "with") {
      auto n = make<Node>(Node::K::With, t);
      ++i_;
      while (cur().t != Tok::BlockEnd) {
        if (!n->targets.empty()) expect_op(",");
        n->targets.push_back(expect_name());
        expect_op("=");
        n->values.push_back(parse_expression(true));
      }
      expect_block_end();
      n->bodies.push_back(parse_body({"endwith"}, found));
      expect_block_end();
      return n;
    }
    if (kw == "generation") {  // transformers' AssistantTracker: renders its body unchanged
      auto n = make<Node>(Node::K::Scope, t);
      ++i_;
      expect_block_end();
      n->bodies.push_back(parse_body({"endgeneration"}, found));
      expect_block_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      auto n = make<Node>(kw == "break" ? Node::K::Break : Node::K::Continue, t);
      ++i_;
      expect_block_end();
      return n;
    }
    static const char* known_unsupported[] = {"extends", "include", "import", "from", "block", "call",
                                              "autoescape", "do", "trans"};
    for (const char* u : known_unsupported)
      if (kw == u) error("the '" + kw + "' statement is not supported by atlas's template subset");
    error("unknown or unexpected tag '" + kw + "'");
  }

  // Assignment targets: name | name.attr (set only) | a, b | (a, b).
  void parse_targets(Node& n, bool allow_attr) {
    bool paren = is_op("(");
    if (paren) ++i_;
    n.targets.push_back(expect_name());
    if (allow_attr && !paren && is_op(".")) {
      ++i_;
      n.attr = expect_name();
      return;
    }
    while (is_op(",")) {
      ++i_;
      n.tuple_target = true;
      if (cur().t != Tok::Name) break;
      n.targets.push_back(expect_name());
    }
    if (paren) {
      n.tuple_target = true;
      expect_op(")");
    }
  }

  // `| f1(args) | f2` after a set-block name, or `f1 | f2` after `filter`.
  void parse_filter_chain(Node& n, bool first_without_pipe = false) {
    bool first = true;
    for (;;) {
      if (first && first_without_pipe) {
        ++i_;  // sits on the `filter` keyword
      } else {
        if (!is_op("|")) break;
        ++i_;
      }
      first = false;
      auto f = make<Expr>(Expr::K::Filter, cur());
      f->name = expect_name();
      f->args.push_back(nullptr);
      if (is_op("(")) parse_call_args(*f);
      n.filters.push_back(std::move(f));
    }
  }

  // ---- expressions (Jinja's precedence) ----

  // Comma-separated expressions at statement level: a bare `a, b` is a tuple.
  ExprPtr parse_tuple(bool with_condexpr) {
    const Tok& start = cur();
    std::vector<ExprPtr> items;
    bool comma = false;
    for (;;) {
      if (!items.empty()) {
        if (!is_op(",")) break;
        ++i_;
        comma = true;
        if (cur().t == Tok::BlockEnd || cur().t == Tok::VarEnd || is_name("if") || is_op(")")) break;
      }
      items.push_back(with_condexpr ? parse_expression(true) : parse_or());
    }
    if (items.size() == 1 && !comma) return std::move(items[0]);
    auto e = make<Expr>(Expr::K::Tuple, start);
    e->args = std::move(items);
    return e;
  }

  // Nesting is bounded so a hostile template cannot overflow the parser's (or evaluator's) stack.
  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& x) : p(x) {
      if (++p.depth_ > 600) p.error("expression nested too deeply");
    }
    ~DepthGuard() { --p.depth_; }
  };

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    ExprPtr e = parse_or();
    if (!with_condexpr) return e;
    while (is_name("if")) {
      auto c = make<Expr>(Expr::K::Cond, cur());
      ++i_;
      c->args.push_back(parse_or());
      c->args.push_back(std::move(e));
      if (is_name("else")) {
        ++i_;
        c->args.push_back(parse_expression(true));
      } else {
        c->args.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::K k, const Tok& at, ExprPtr l, ExprPtr r, std::string op = {}) {
    auto e = make<Expr>(k, at);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const Tok& at = cur();
      ++i_;
      l = binary(Expr::K::Or, at, std::move(l), parse_and());
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const Tok& at = cur();
      ++i_;
      l = binary(Expr::K::And, at, std::move(l), parse_not());
    }
    return l;
  }
  ExprPtr parse_not() {
    DepthGuard guard(*this);
    if (is_name("not")) {
      auto e = make<Expr>(Expr::K::Not, cur());
      ++i_;
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const Tok& at = cur();
    ExprPtr first = parse_math1();
    std::unique_ptr<Expr> cmp;
    for (;;) {
      std::string op;
      if (cur().t == Tok::Op && (cur().s == "==" || cur().s == "!=" || cur().s == "<" || cur().s == "<=" ||
                                 cur().s == ">" || cur().s == ">=")) {
        op = cur().s;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().t == Tok::Name && peek().s == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make<Expr>(Expr::K::Compare, at);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Tok& at = cur();
      ++i_;
      l = binary(Expr::K::Binary, at, std::move(l), parse_concat(), at.s);
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (is_op("~")) {
      const Tok& at = cur();
      ++i_;
      l = binary(Expr::K::Binary, at, std::move(l), parse_math2(), "~");
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Tok& at = cur();
      ++i_;
      l = binary(Expr::K::Binary, at, std::move(l), parse_pow(), at.s);
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (is_op("**")) {
      const Tok& at = cur();
      ++i_;
      l = binary(Expr::K::Binary, at, std::move(l), parse_unary(true), "**");
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      auto u = make<Expr>(is_op("-") ? Expr::K::Neg : Expr::K::Pos, cur());
      ++i_;
      u->args.push_back(parse_unary(false));
      e = std::move(u);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Tok& t = cur();
    switch (t.t) {
      case Tok::Name: {
        ++i_;
        auto e = make<Expr>(Expr::K::Literal, t);
        if (t.s == "true" || t.s == "True") {
          e->lit = Value(true);
        } else if (t.s == "false" || t.s == "False") {
          e->lit = Value(false);
        } else if (t.s == "none" || t.s == "None") {
          e->lit = Value::none();
        } else {
          e->k = Expr::K::Name;
          e->name = t.s;
        }
        return e;
      }
      case Tok::String: {
        auto e = make<Expr>(Expr::K::Literal, t);
        std::string s;
        while (cur().t == Tok::String) s += t_[i_++].s;  // adjacent literals concatenate
        e->lit = Value(std::move(s));
        return e;
      }
      case Tok::Int:
      case Tok::Float: {
        auto e = make<Expr>(Expr::K::Literal, t);
        e->lit = t.t == Tok::Int ? Value(t.i) : Value(t.f);
        ++i_;
        return e;
      }
      case Tok::Op:
        if (t.s == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            auto e = make<Expr>(Expr::K::Tuple, t);
            return e;
          }
          ExprPtr e = parse_tuple(true);
          expect_op(")");
          return e;
        }
        if (t.s == "[") {
          auto e = make<Expr>(Expr::K::List, t);
          ++i_;
          while (!is_op("]")) {
            e->args.push_back(parse_expression(true));
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("]");
          return e;
        }
        if (t.s == "{") {
          auto e = make<Expr>(Expr::K::Dict, t);
          ++i_;
          while (!is_op("}")) {
            e->args.push_back(parse_expression(true));
            expect_op(":");
            e->args.push_back(parse_expression(true));
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    error("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        const Tok& at = cur();
        ++i_;
        if (cur().t == Tok::Int) {  // foo.0 is foo[0]
          auto g = make<Expr>(Expr::K::Item, at);
          auto idx = make<Expr>(Expr::K::Literal, cur());
          idx->lit = Value(cur().i);
          ++i_;
          g->args.push_back(std::move(e));
          g->args.push_back(std::move(idx));
          e = std::move(g);
          continue;
        }
        auto g = make<Expr>(Expr::K::Attr, at);
        g->name = expect_name();
        g->args.push_back(std::move(e));
        e = std::move(g);
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        auto c = make<Expr>(Expr::K::Call, cur());
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    const Tok& at = cur();
    ++i_;  // '['
    ExprPtr parts[3];
    bool slice = false;
    if (!is_op(":")) parts[0] = parse_expression(true);
    if (is_op(":")) {
      slice = true;
      ++i_;
      if (!is_op("]") && !is_op(":")) parts[1] = parse_expression(true);
      if (is_op(":")) {
        ++i_;
        if (!is_op("]")) parts[2] = parse_expression(true);
      }
    }
    if (is_op(",")) error("multi-dimensional subscripts are not supported");
    expect_op("]");
    auto e = make<Expr>(slice ? Expr::K::Slice : Expr::K::Item, at);
    e->args.push_back(std::move(obj));
    for (int k = 0; k < (slice ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) error("*args / **kwargs in calls are not supported");
      if (cur().t == Tok::Name && peek().t == Tok::Op && peek().s == "=") {
        std::string k = cur().s;
        i_ += 2;
        e.kwargs.emplace_back(k, parse_expression(true));
      } else {
        if (!e.kwargs.empty()) error("positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        auto f = make<Expr>(Expr::K::Filter, cur());
        ++i_;
        f->name = expect_name();
        while (is_op(".")) {  // dotted filter names
          ++i_;
          f->name += '.';
          f->name += expect_name();
        }
        f->args.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*f);
        e = std::move(f);
      } else if (is_name("is")) {
        auto tst = make<Expr>(Expr::K::Test, cur());
        ++i_;
        if (is_name("not")) {
          tst->negated = true;
          ++i_;
        }
        tst->name = expect_name();
        while (is_op(".")) {
          ++i_;
          tst->name += '.';
          tst->name += expect_name();
        }
        tst->args.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*tst);
        } else if ((cur().t == Tok::Name || cur().t == Tok::String || cur().t == Tok::Int || cur().t == Tok::Float ||
                    is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) error("you cannot chain multiple tests with 'is'");
          tst->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(tst);
      } else if (is_op("(")) {
        auto c = make<Expr>(Expr::K::Call, cur());
        c->args.push_back(std::move(e));
        parse_call_args(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  const Lexer& lx_;
  std::vector<Tok> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

std::string normalise_newlines(const std::string& s, bool keep_trailing) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\r') {
      out += '\n';
      if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
    } else {
      out += s[i];
    }
  }
  if (!keep_trailing && !out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

Template Template::parse(const std::string& source, const std::string& name, const TemplateOptions& opt) {
  Lexer lx(normalise_newlines(source, opt.keep_trailing_newline), name, opt);
  Parser p(lx, lx.run());
  Template t;
  t.name_ = name;
  t.body_ = std::make_shared<const Body>(p.parse_template());
  return t;
}

}  // namespace atlas::tmpl
