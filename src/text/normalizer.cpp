#include "text/normalizer.hpp"

namespace deltaflow::text::tokenizer_impl {

std::string_view Normalizer::apply(std::string_view in, std::string& buf) const {
  std::string_view cur = in;
  std::string tmp;
  for (NormalForm f : steps_) {
    if (f == NormalForm::kNfc) {
      if (nfc_changed(cur, tmp)) {
        buf.swap(tmp);
        cur = buf;
      }
      continue;
    }
    if (normalization_is_identity(cur, f)) continue;
    if (!normalize_unicode(cur, f, tmp)) continue;  // out of memory: leave the text as it is
    buf.swap(tmp);
    cur = buf;
  }
  return cur;
}

}  // namespace deltaflow::text::tokenizer_impl
