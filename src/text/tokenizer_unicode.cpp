#include "text/tokenizer_unicode.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <utf8proc.h>

namespace deltaflow::text::tokenizer_impl {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

char32_t decode_utf8(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  len = utf8_seq_len(b0);
  if (i + len > s.size()) len = s.size() - i;  // defensive: callers pass valid UTF-8
  auto cont = [&](size_t k) -> char32_t { return static_cast<unsigned char>(s[i + k]) & 0x3F; };
  switch (len) {
    case 1:
      return b0;
    case 2:
      return (char32_t(b0 & 0x1F) << 6) | cont(1);
    case 3:
      return (char32_t(b0 & 0x0F) << 12) | (cont(1) << 6) | cont(2);
    default:
      return (char32_t(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
  }
}

namespace {

// Table 3-7 of the Unicode standard: for a lead byte, how many continuation bytes follow and the allowed
// range of the first one (the others are always 80..BF). need == 0 marks an invalid lead.
struct LeadInfo {
  int need;
  unsigned char lo, hi;
};

inline LeadInfo lead_info(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {0, 0, 0};
}

inline bool all_ascii8(const char* p) {
  uint64_t w;
  std::memcpy(&w, p, 8);
  return (w & 0x8080808080808080ULL) == 0;
}

}  // namespace

bool is_valid_utf8(std::string_view s) {
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n && all_ascii8(s.data() + i)) {
      i += 8;
      continue;
    }
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const LeadInfo li = lead_info(b);
    if (li.need == 0 || i + static_cast<size_t>(li.need) >= n) return false;
    const auto b1 = static_cast<unsigned char>(s[i + 1]);
    if (b1 < li.lo || b1 > li.hi) return false;
    for (int k = 2; k <= li.need; ++k) {
      const auto bk = static_cast<unsigned char>(s[i + k]);
      if (bk < 0x80 || bk > 0xBF) return false;
    }
    i += 1 + li.need;
  }
  return true;
}

size_t append_utf8_lossy(std::string& out, std::string_view s, bool final) {
  const size_t n = s.size();
  size_t i = 0;
  size_t run = 0;  // start of the pending run of valid bytes, copied in one go
  auto flush_run = [&](size_t end) {
    if (end > run) out.append(s.data() + run, end - run);
  };
  while (i < n) {
    if (i + 8 <= n && all_ascii8(s.data() + i)) {
      i += 8;
      continue;
    }
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const LeadInfo li = lead_info(b);
    if (li.need == 0) {
      flush_run(i);
      append_utf8(out, kReplacementChar);
      run = ++i;
      continue;
    }
    // Walk the continuation bytes; k counts how many of them are right.
    int k = 0;
    bool truncated = false;
    while (k < li.need) {
      if (i + 1 + k >= n) {
        truncated = true;
        break;
      }
      const auto bk = static_cast<unsigned char>(s[i + 1 + k]);
      const bool ok = (k == 0) ? (bk >= li.lo && bk <= li.hi) : (bk >= 0x80 && bk <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (k == li.need) {
      i += 1 + li.need;
      continue;
    }
    if (truncated && !final) {
      // A valid prefix of a character at the end: leave it for the next chunk.
      flush_run(i);
      return i;
    }
    // The lead plus the k good continuation bytes form one maximal subpart: one replacement character.
    flush_run(i);
    append_utf8(out, kReplacementChar);
    i += 1 + k;
    run = i;
  }
  flush_run(n);
  return n;
}

bool is_white_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_word_char(char32_t c) {
  if (c < 0x80) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  if (c == 0x200C || c == 0x200D) return true;  // Join_Control
  // Other_Alphabetic symbols (circled and squared Latin letters) are Alphabetic though categorised So.
  if ((c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) || (c >= 0x1F150 && c <= 0x1F169) ||
      (c >= 0x1F170 && c <= 0x1F189))
    return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return false;
  }
}

bool normalization_is_identity(std::string_view in, NormalForm form) {
  // NFC/NFD leave code points below U+0300 (lead byte < 0xCC) alone except that NFD decomposes the
  // precomposed Latin-1 letters from U+00C0 (C3 80) up; the compatibility forms also change U+00A0 onward.
  unsigned char limit = 0;
  switch (form) {
    case NormalForm::kNfc:
      limit = 0xCC;
      break;
    case NormalForm::kNfd:
    case NormalForm::kNfkc:
    case NormalForm::kNfkd:
      limit = 0x80;  // ASCII only: keep the fast path simple
      break;
  }
  for (char ch : in)
    if (static_cast<unsigned char>(ch) >= limit) return false;
  return true;
}

bool normalize_unicode(std::string_view in, NormalForm form, std::string& out) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* dst = nullptr;
  const utf8proc_ssize_t len =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(in.data()),
                   static_cast<utf8proc_ssize_t>(in.size()), &dst, static_cast<utf8proc_option_t>(options));
  if (len < 0) {
    std::free(dst);
    return false;
  }
  out.assign(reinterpret_cast<const char*>(dst), static_cast<size_t>(len));
  std::free(dst);
  return true;
}

namespace {

// Whether cp is a safe NFC boundary: combining class 0, unchanged by NFC alone, and never the second
// character of a composition (which is what NFC_Quick_Check=Maybe means).
bool compute_nfc_inert(char32_t cp) {
  if (cp >= 0xD800 && cp <= 0xDFFF) return true;
  // Hangul V and T jamo compose with a preceding syllable algorithmically (no comb_index entry).
  if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return false;
  const auto c = static_cast<utf8proc_int32_t>(cp);
  const utf8proc_property_t* p = utf8proc_get_property(c);
  if (p->combining_class != 0) return false;
  if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;  // a composition's second
  if (p->decomp_seqindex == UINT16_MAX) return true;  // no decomposition (Hangul syllables recompose)
  utf8proc_int32_t buf[16];
  const utf8proc_ssize_t n =
      utf8proc_decompose_char(c, buf, 16, static_cast<utf8proc_option_t>(UTF8PROC_DECOMPOSE), nullptr);
  if (n == 1 && buf[0] == c) return true;
  if (n <= 0 || n > 16) return false;
  const utf8proc_ssize_t m =
      utf8proc_normalize_utf32(buf, n, static_cast<utf8proc_option_t>(UTF8PROC_COMPOSE | UTF8PROC_STABLE));
  return m == 1 && buf[0] == c;
}

// Lazily filled bit table for code points below 0x40000 (all assigned ones but plane 14), by blocks of 1024.
class NfcInertTable {
 public:
  bool get(char32_t cp) {
    if (cp >= kLimit) return compute_nfc_inert(cp);
    const size_t block = cp >> 10;
    if (!ready_[block].load(std::memory_order_acquire)) fill(block);
    return (bits_[cp >> 3] >> (cp & 7)) & 1;
  }

 private:
  static constexpr char32_t kLimit = 0x40000;
  void fill(size_t block) {
    std::lock_guard<std::mutex> lock(mu_);
    if (ready_[block].load(std::memory_order_relaxed)) return;
    for (char32_t cp = static_cast<char32_t>(block << 10); cp < static_cast<char32_t>((block + 1) << 10);
         ++cp)
      if (compute_nfc_inert(cp)) bits_[cp >> 3] |= static_cast<uint8_t>(1u << (cp & 7));
    ready_[block].store(true, std::memory_order_release);
  }
  std::mutex mu_;
  std::atomic<bool> ready_[kLimit >> 10] = {};
  uint8_t bits_[kLimit >> 3] = {};
};

NfcInertTable& nfc_table() {
  static NfcInertTable* table = new NfcInertTable();  // never destroyed: used from any thread until exit
  return *table;
}

}  // namespace

bool nfc_changed(std::string_view in, std::string& out) {
  const size_t n = in.size();
  size_t i = 0;
  // Fast path: code points below U+0300 are all safe boundaries.
  while (i < n && static_cast<unsigned char>(in[i]) < 0xCC) ++i;
  if (i == n) return false;
  NfcInertTable& table = nfc_table();
  size_t copied = 0;                      // in[0, copied) is already in out
  size_t last_starter = 0;                // start of the last safe boundary character
  size_t dirty = std::string_view::npos;  // start of the stretch that needs utf8proc
  bool changed = false;
  std::string tmp;
  auto flush_dirty = [&](size_t end) {
    const std::string_view piece = in.substr(dirty, end - dirty);
    if (!normalize_unicode(piece, NormalForm::kNfc, tmp) || tmp == piece) return;
    if (!changed) {
      out.clear();
      out.reserve(n + 16);
      changed = true;
    }
    out.append(in.data() + copied, dirty - copied);
    out += tmp;
    copied = end;
  };
  // Restart from the last character before i: i may sit inside a multi-byte sequence's tail.
  while (i > 0 && (static_cast<unsigned char>(in[i]) & 0xC0) == 0x80) --i;
  {
    size_t j = i;
    while (j > 0) {
      --j;
      if ((static_cast<unsigned char>(in[j]) & 0xC0) != 0x80) break;
    }
    last_starter = j;  // everything before i is below U+0300: safe boundaries
  }
  while (i < n) {
    const auto b = static_cast<unsigned char>(in[i]);
    size_t len = 1;
    bool inert;
    if (b < 0xCC) {
      len = utf8_seq_len(b);
      inert = true;
    } else {
      const char32_t cp = decode_utf8(in, i, len);
      inert = table.get(cp);
    }
    if (inert) {
      if (dirty != std::string_view::npos) {
        flush_dirty(i);
        dirty = std::string_view::npos;
      }
      last_starter = i;
    } else if (dirty == std::string_view::npos) {
      dirty = last_starter;
    }
    i += len;
  }
  if (dirty != std::string_view::npos) flush_dirty(n);
  if (!changed) return false;
  out.append(in.data() + copied, n - copied);
  return true;
}

}  // namespace deltaflow::text::tokenizer_impl
