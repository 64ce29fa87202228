#include "tokenizer/regex.h"

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace tetra::tok {

// One node of the parsed pattern. Single-character nodes (Char, Set, Any) test one code point.
struct Regex::Node {
  enum class Kind { Char, Set, Any, Concat, Alt, Repeat, Look } kind;
  char32_t ch = 0;
  bool icase = false;
  // Set: ranges and categories, each possibly negated, the whole set possibly negated.
  bool negated = false;
  std::vector<std::pair<char32_t, char32_t>> ranges;
  std::vector<std::pair<Category, bool>> categories;  // {category, negated (\P)}
  std::vector<int> spaces;
  std::vector<std::unique_ptr<Node>> kids;
  int min = 0, max = 0;  // Repeat; max -1 = unbounded
  bool lazy = false;
  bool negative = false;  // Look: (?!...) vs (?=...)

  explicit Node(Kind k) : kind(k) {}
  bool single() const { return kind == Kind::Char || kind == Kind::Set || kind == Kind::Any; }
};

namespace {

using Node = Regex::Node;
using Kind = Node::Kind;

// Simple case folding as far as the contraction patterns need: ASCII, plus the two non-ASCII
// code points whose simple fold is an ASCII letter (U+017F long s -> s, U+212A Kelvin -> k).
char32_t fold(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c == 0x17F) return 's';
  if (c == 0x212A) return 'k';
  return c;
}

bool set_matches(const Node& n, char32_t c) {
  bool hit = false;
  for (const auto& [a, b] : n.ranges) hit = hit || (c >= a && c <= b);
  if (!hit && !n.categories.empty()) {
    const Category cat = category(c);
    for (const auto& [want, neg] : n.categories) hit = hit || ((cat == want) != neg);
  }
  for (int s : n.spaces) hit = hit || (is_white_space(c) == (s > 0));
  return hit != n.negated;
}

bool char_matches(const Node& n, char32_t c) {
  switch (n.kind) {
    case Kind::Char: return n.icase ? fold(c) == fold(n.ch) : c == n.ch;
    case Kind::Any: return c != '\n';
    case Kind::Set: return set_matches(n, c);
    default: return false;
  }
}

class Parser {
 public:
  explicit Parser(std::string_view pattern) : src_(pattern), p_(utf8_to_u32(pattern, "regex pattern")) {
    // Matching recurses once per pattern element; shipped patterns are under 300 code points.
    if (p_.size() > 2048) TETRA_FAIL("unsupported pre-tokenizer regex construct (pattern longer than 2048 code points)");
  }

  std::unique_ptr<Node> parse() {
    auto n = alternation(false);
    if (i_ < p_.size()) fail("unbalanced ')'");
    return n;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const {
    TETRA_FAIL("unsupported pre-tokenizer regex construct (", what, ") at code point ", i_,
               " of pattern ", src_);
  }
  bool more() const { return i_ < p_.size(); }
  char32_t peek() const { return p_[i_]; }
  bool eat(char32_t c) {
    if (more() && p_[i_] == c) return ++i_, true;
    return false;
  }

  std::unique_ptr<Node> alternation(bool icase) {
    auto alt = std::make_unique<Node>(Kind::Alt);
    alt->kids.push_back(concat(icase));
    while (eat('|')) alt->kids.push_back(concat(icase));
    if (alt->kids.size() == 1) return std::move(alt->kids[0]);
    return alt;
  }

  std::unique_ptr<Node> concat(bool icase) {
    auto seq = std::make_unique<Node>(Kind::Concat);
    while (more() && peek() != '|' && peek() != ')') {
      auto atom_node = atom(icase);
      seq->kids.push_back(quantified(std::move(atom_node)));
    }
    return seq;
  }

  std::unique_ptr<Node> quantified(std::unique_ptr<Node> atom_node) {
    int lo = -1, hi = -1;
    if (eat('?')) lo = 0, hi = 1;
    else if (eat('*')) lo = 0, hi = -1;
    else if (eat('+')) lo = 1, hi = -1;
    else if (more() && peek() == '{') {
      ++i_;
      lo = number();
      hi = lo;
      if (eat(',')) hi = (more() && peek() == '}') ? -1 : number();
      if (!eat('}')) fail("malformed {m,n}");
      if (hi != -1 && hi < lo) fail("{m,n} with n < m");
    }
    if (lo < 0) return atom_node;
    if (atom_node->kind == Kind::Look) fail("quantified lookahead");
    // Repeating a group recurses once per repetition; the shipped patterns only repeat single
    // characters and classes (an iterative loop), so long group repeats are refused.
    if (!atom_node->single() && (hi < 0 || hi > kMaxGroupRepeat)) fail("group repeated more than 16 times");
    auto rep = std::make_unique<Node>(Kind::Repeat);
    rep->min = lo, rep->max = hi;
    rep->lazy = eat('?');
    if (more() && (peek() == '+' || peek() == '*' || peek() == '?' || peek() == '{'))
      fail("possessive or stacked quantifier");
    rep->kids.push_back(std::move(atom_node));
    return rep;
  }

  int number() {
    int v = 0, digits = 0;
    while (more() && peek() >= '0' && peek() <= '9' && digits < 6) v = v * 10 + int(p_[i_++] - '0'), ++digits;
    if (digits == 0) fail("expected a number in {m,n}");
    return v;
  }

  std::unique_ptr<Node> atom(bool icase) {
    const char32_t c = p_[i_++];
    if (c == '(') return group(icase);
    if (c == '[') return char_class();
    if (c == '.') return std::make_unique<Node>(Kind::Any);
    if (c == '\\') return escape_atom(icase);
    if (c == '^' || c == '$') fail("anchor");
    if (c == '*' || c == '+' || c == '?' || c == '{') fail("quantifier without an operand");
    auto n = std::make_unique<Node>(Kind::Char);
    n->ch = c, n->icase = icase;
    return n;
  }

  std::unique_ptr<Node> group(bool icase) {
    // Real patterns nest two or three deep; a bound keeps parsing and matching off deep recursion.
    if (++depth_ > kMaxDepth) fail("groups nested deeper than 32");
    std::unique_ptr<Node> n;
    if (eat('?')) {
      if (eat(':')) {
        n = alternation(icase);
      } else if (eat('!') || (more() && peek() == '=')) {
        const bool negative = p_[i_ - 1] == '!';
        if (!negative) ++i_;
        n = std::make_unique<Node>(Kind::Look);
        n->negative = negative;
        n->kids.push_back(alternation(icase));
      } else if (eat('i')) {
        if (!eat(':')) fail("inline flags other than (?i:...)");
        n = alternation(true);
      } else {
        fail("group kind");
      }
    } else {
      n = alternation(icase);  // captures are not needed: a plain group
    }
    if (!eat(')')) fail("missing ')'");
    --depth_;
    return n;
  }

  // \x outside a class: a class escape (\s \S \p{..}) or a literal.
  std::unique_ptr<Node> escape_atom(bool icase) {
    auto set = std::make_unique<Node>(Kind::Set);
    if (class_escape(*set)) return set;
    auto n = std::make_unique<Node>(Kind::Char);
    n->ch = literal_escape();
    n->icase = icase;
    return n;
  }

  // After a backslash: adds \s \S \p{..} \P{..} to `set` and returns true, else false.
  bool class_escape(Node& set) {
    if (!more()) fail("trailing backslash");
    const char32_t c = peek();
    if (c == 's' || c == 'S') {
      ++i_;
      set.spaces.push_back(c == 's' ? 1 : -1);
      return true;
    }
    if (c == 'p' || c == 'P') {
      ++i_;
      if (!eat('{')) fail("\\p without {");
      std::u32string name;
      while (more() && peek() != '}') name.push_back(p_[i_++]);
      if (!eat('}')) fail("unterminated \\p{");
      bool neg = c == 'P';
      if (!name.empty() && name[0] == '^') neg = !neg, name.erase(0, 1);
      static const std::u32string kNames = U"LMNPSZC";
      const size_t at = name.size() == 1 ? kNames.find(name[0]) : std::u32string::npos;
      if (at == std::u32string::npos) fail("Unicode property other than L, M, N, P, S, Z, C");
      set.categories.push_back({static_cast<Category>(at), neg});
      return true;
    }
    if (c == 'd' || c == 'D' || c == 'w' || c == 'W' || c == 'b' || c == 'B' || (c >= '0' && c <= '9'))
      fail("\\d, \\w, \\b or a back reference");
    return false;
  }

  char32_t literal_escape() {
    const char32_t c = p_[i_++];
    switch (c) {
      case 'r': return '\r';
      case 'n': return '\n';
      case 't': return '\t';
      case 'f': return '\f';
      case 'v': return '\v';
      default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) fail("escape letter");
    return c;  // escaped punctuation stands for itself
  }

  std::unique_ptr<Node> char_class() {
    auto set = std::make_unique<Node>(Kind::Set);
    set->negated = eat('^');
    bool first = true;
    while (more() && (peek() != ']' || first)) {
      first = false;
      char32_t lo;
      if (eat('\\')) {
        if (class_escape(*set)) continue;
        lo = literal_escape();
      } else {
        lo = p_[i_++];
        if (lo == '[') fail("nested class");
      }
      char32_t hi = lo;
      if (more() && peek() == '-' && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        if (eat('\\')) {
          Node probe(Kind::Set);
          if (class_escape(probe)) fail("range ending in a class escape");
          hi = literal_escape();
        } else {
          hi = p_[i_++];
        }
        if (hi < lo) fail("reversed range");
      }
      set->ranges.push_back({lo, hi});
    }
    if (!eat(']')) fail("unterminated [");
    return set;
  }

  static constexpr int kMaxDepth = 32;
  static constexpr int kMaxGroupRepeat = 16;
  std::string_view src_;
  std::u32string p_;
  size_t i_ = 0;
  int depth_ = 0;
};

// A non-owning reference to a callable bool(size_t): continuations live on the caller's stack
// for the whole call, and std::function would heap-allocate their captures at every step.
class Cont {
 public:
  template <typename F>
  Cont(const F& f) : obj_(&f), call_([](const void* o, size_t i) { return (*static_cast<const F*>(o))(i); }) {}  // NOLINT: implicit by design
  bool operator()(size_t i) const { return call_(obj_, i); }

 private:
  const void* obj_;
  bool (*call_)(const void*, size_t);
};

class Matcher {
 public:
  explicit Matcher(std::u32string_view t) : t_(t) {}

  bool match(const Node& n, size_t i, const Cont& k) const {
    switch (n.kind) {
      case Kind::Char:
      case Kind::Set:
      case Kind::Any:
        return i < t_.size() && char_matches(n, t_[i]) && k(i + 1);
      case Kind::Concat: return seq(n, 0, i, k);
      case Kind::Alt:
        for (const auto& kid : n.kids)
          if (match(*kid, i, k)) return true;
        return false;
      case Kind::Look: {
        const auto accept = [](size_t) { return true; };
        const bool hit = match(*n.kids[0], i, accept);
        return hit != n.negative && k(i);
      }
      case Kind::Repeat: {
        const Node& kid = *n.kids[0];
        if (kid.single()) return repeat_single(n, kid, i, k);
        return repeat(n, 0, i, k);
      }
    }
    return false;
  }

 private:
  bool seq(const Node& n, size_t idx, size_t i, const Cont& k) const {
    if (idx == n.kids.size()) return k(i);
    const auto next = [&](size_t j) { return seq(n, idx + 1, j, k); };
    return match(*n.kids[idx], i, next);
  }

  // A run of one-character matches: count the longest run, then try lengths in priority order.
  bool repeat_single(const Node& n, const Node& kid, size_t i, const Cont& k) const {
    size_t run = 0;
    const size_t cap = n.max < 0 ? t_.size() : size_t(n.max);
    while (run < cap && i + run < t_.size() && char_matches(kid, t_[i + run])) ++run;
    if (run < size_t(n.min)) return false;
    if (n.lazy) {
      for (size_t c = size_t(n.min); c <= run; ++c)
        if (k(i + c)) return true;
    } else {
      for (size_t c = run + 1; c-- > size_t(n.min);)
        if (k(i + c)) return true;
    }
    return false;
  }

  bool repeat(const Node& n, int count, size_t i, const Cont& k) const {
    const bool may_stop = count >= n.min;
    const bool may_go = n.max < 0 || count < n.max;
    auto again = [&](size_t j) { return j != i && repeat(n, count + 1, j, k); };  // no empty loops
    if (n.lazy) {
      if (may_stop && k(i)) return true;
      return may_go && match(*n.kids[0], i, again);
    }
    if (may_go && match(*n.kids[0], i, again)) return true;
    return may_stop && k(i);
  }

  std::u32string_view t_;
};

}  // namespace

Regex::Regex(std::string_view pattern) : pattern_(pattern), root_(Parser(pattern).parse()) {}
Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

std::pair<size_t, size_t> Regex::find(std::u32string_view text, size_t from) const {
  const Matcher m(text);
  for (size_t start = from; start < text.size(); ++start) {
    size_t end = start;
    const auto done = [&](size_t e) { return e > start && (end = e, true); };
    if (m.match(*root_, start, done))
      return {start, end};
  }
  return {std::u32string::npos, std::u32string::npos};
}

std::vector<std::pair<size_t, size_t>> Regex::find_all(std::u32string_view text) const {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t from = 0; from < text.size();) {
    const auto m = find(text, from);
    if (m.first == std::u32string::npos) break;
    out.push_back(m);
    from = m.second;
  }
  return out;
}

}  // namespace tetra::tok
