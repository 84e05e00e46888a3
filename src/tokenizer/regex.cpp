#include "tokenizer/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tokenizer/unicode_delta.h"

namespace moeserve {

namespace {

// Two differences between Oniguruma (HF's engine) and PCRE2 are translated away:
//  - Oniguruma's \s is Unicode White_Space: TAB..CR, NEL and the Z categories. PCRE2's \s under
//    UCP also matches U+180E MONGOLIAN VOWEL SEPARATOR (via \h), so \s and \S are spelled out.
//  - Unicode versions: \p{L}, \p{M}, \p{N}, \p{P}, \p{S} get the code points that HF's newer
//    tables assign and PCRE2's leave unassigned (unicode_delta.h).
// Everything else is copied verbatim.
constexpr const char* kSpaceSet = "\\t-\\r\\x{85}\\p{Z}";

// "\p{X}" plus the delta members, for a one-letter major category X with a delta; else "".
std::string property_members(const std::string& p, size_t brace) {
  if (brace + 2 >= p.size() || p[brace] != '{' || p[brace + 2] != '}') return "";
  const char major = p[brace + 1];
  const std::string_view delta = unicode_delta_members(major);
  if (delta.empty()) return "";
  return std::string("\\p{") + major + "}" + std::string(delta);
}

Result<std::string> onig_to_pcre2(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kSpaceSet) : "[" + std::string(kSpaceSet) + "]";
      } else if (e == 'S') {
        if (in_class) return Unimplemented("\\S inside a character class: " + p);
        out += "[^" + std::string(kSpaceSet) + "]";
      } else if ((e == 'p' || e == 'P') && !property_members(p, i + 1).empty()) {
        const std::string members = property_members(p, i + 1);
        i += 3;  // past "{X}"
        if (e == 'P' && in_class) return Unimplemented("\\P{..} inside a character class: " + p);
        if (in_class)
          out += members;
        else
          out += (e == 'P' ? "[^" : "[") + members + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (in_class && c == '[' && i + 1 < p.size() && p[i + 1] == ':') {  // [:alpha:]
      const size_t end = p.find(":]", i + 2);
      if (end != std::string::npos) {
        out.append(p, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

}  // namespace

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Regex::MatchData::MatchData(const Regex& re)
    : md_(pcre2_match_data_create_from_pattern(re.code_->code, nullptr)) {}

Regex::MatchData::~MatchData() {
  pcre2_match_data_free(static_cast<pcre2_match_data*>(md_));
}

Result<Regex> Regex::compile(const std::string& onig_pattern) {
  ASSIGN_OR_RETURN(const std::string pattern, onig_to_pcre2(onig_pattern));
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &err_off, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof(buf));
    return InvalidArgument("regex '" + pattern + "' at offset " + std::to_string(err_off) + ": " +
                           reinterpret_cast<const char*>(buf));
  }
  auto c = std::make_shared<Code>();
  c->code = code;
  // JIT is an optimisation: without it (unsupported CPU) the interpreter gives the same matches.
  c->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex re;
  re.code_ = std::move(c);
  re.pattern_ = onig_pattern;
  return re;
}

bool Regex::find(std::string_view subject, size_t offset, MatchData& md, size_t* begin,
                 size_t* end) const {
  auto* m = static_cast<pcre2_match_data*>(md.md_);
  const auto* s = reinterpret_cast<PCRE2_SPTR>(subject.data());
  int rc = PCRE2_ERROR_NOMATCH - 1;
  if (code_->jit) rc = pcre2_jit_match(code_->code, s, subject.size(), offset, 0, m, nullptr);
  // Without JIT, or when the JIT ran out of its stack, the interpreter (heap frames) decides.
  if (rc < PCRE2_ERROR_NOMATCH) {
    rc = pcre2_match(code_->code, s, subject.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, m,
                     nullptr);
  }
  // rc < 0 here: no match, or a heap limit that the bounded backtracking of tokenizer patterns
  // does not reach; the remainder is then treated as unmatched text, never a crash.
  if (rc <= 0) return false;
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m);
  *begin = ov[0];
  *end = ov[1];
  return true;
}

}  // namespace moeserve
