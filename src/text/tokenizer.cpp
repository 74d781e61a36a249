#include "text/tokenizer.hpp"

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "text/added_tokens.hpp"
#include "text/bpe.hpp"
#include "text/byte_level.hpp"
#include "text/normalizer.hpp"
#include "text/pre_tokenizer.hpp"
#include "text/tokenizer_unicode.hpp"

namespace deltaflow::text {

using json = nlohmann::json;
using namespace tokenizer_impl;

namespace {

// Everything one encode call needs; owned by a cache shard, or made on the spot when all shards are busy.
struct EncodeState {
  explicit EncodeState(size_t cache_entries) : cache(cache_entries) {}
  WordCache cache;
  BpeScratch bpe;
  PreTokenizerScratch pre;
  std::vector<AddedVocabulary::Split> raw_splits, norm_splits;
  std::string norm_buf;
};

constexpr size_t kShards = 8;
// Ids are dense in every real vocabulary; the bound keeps a corrupt file from asking for huge tables.
constexpr int64_t kMaxId = int64_t{1} << 24;

enum class DecoderKind { kNone, kByteLevel };

std::string type_of(const json& j) {
  if (!j.is_object()) return "";
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

bool get_bool(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean()) throw std::runtime_error(std::string("field '") + key + "' must be a boolean");
  return it->get<bool>();
}

std::optional<std::string> get_opt_string(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_string()) throw std::runtime_error(std::string("field '") + key + "' must be a string or null");
  return it->get<std::string>();
}

core::Status parse_normalizer(const json& j, std::vector<NormalForm>& steps) {
  if (j.is_null()) return core::Status::ok();
  const std::string t = type_of(j);
  if (t == "NFC")
    steps.push_back(NormalForm::kNfc);
  else if (t == "NFD")
    steps.push_back(NormalForm::kNfd);
  else if (t == "NFKC")
    steps.push_back(NormalForm::kNfkc);
  else if (t == "NFKD")
    steps.push_back(NormalForm::kNfkd);
  else if (t == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array())
      return core::Error{"normalizer Sequence: 'normalizers' must be an array"};
    for (const auto& sub : *it) DF_TRY(parse_normalizer(sub, steps));
  } else {
    return core::Error{"normalizer '" + (t.empty() ? j.dump().substr(0, 60) : t) + "' is not supported"};
  }
  return core::Status::ok();
}

core::Status parse_pre_tokenizer(const json& j, std::vector<PreTokenizerStep>& steps) {
  if (j.is_null()) return core::Status::ok();
  const std::string t = type_of(j);
  if (t == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      return core::Error{"pre_tokenizer Sequence: 'pretokenizers' must be an array"};
    for (const auto& sub : *it) DF_TRY(parse_pre_tokenizer(sub, steps));
    return core::Status::ok();
  }
  PreTokenizerStep step;
  if (t == "Split") {
    auto pit = j.find("pattern");
    if (pit == j.end() || !pit->is_object())
      return core::Error{"pre_tokenizer Split: 'pattern' must be an object"};
    bool literal;
    std::string pattern;
    if (auto r = pit->find("Regex"); r != pit->end() && r->is_string()) {
      literal = false;
      pattern = r->get<std::string>();
    } else if (auto s = pit->find("String"); s != pit->end() && s->is_string()) {
      literal = true;
      pattern = s->get<std::string>();
    } else {
      return core::Error{"pre_tokenizer Split: pattern must be {\"Regex\": ...} or {\"String\": ...}"};
    }
    auto re = Regex::compile(pattern, literal);
    if (!re) return core::Error{"pre_tokenizer Split: " + re.message()};
    step.kind = PreTokenizerStep::Kind::kSplit;
    step.regex = std::move(re).value();
    step.has_regex = true;
    const std::string behavior = j.value("behavior", std::string("Isolated"));
    if (behavior == "Isolated")
      step.behavior = SplitBehavior::kIsolated;
    else if (behavior == "Removed")
      step.behavior = SplitBehavior::kRemoved;
    else if (behavior == "MergedWithPrevious")
      step.behavior = SplitBehavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext")
      step.behavior = SplitBehavior::kMergedWithNext;
    else if (behavior == "Contiguous")
      step.behavior = SplitBehavior::kContiguous;
    else
      return core::Error{"pre_tokenizer Split: behavior '" + behavior + "' is not supported"};
    step.invert = get_bool(j, "invert", false);
  } else if (t == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    // tokenizers' defaults when the fields are missing: add_prefix_space true, use_regex true.
    step.add_prefix_space = get_bool(j, "add_prefix_space", true);
    if (get_bool(j, "use_regex", true)) {
      auto re = Regex::compile(kGpt2Pattern, false);
      if (!re) return core::Error{"pre_tokenizer ByteLevel: " + re.message()};
      step.regex = std::move(re).value();
      step.has_regex = true;
    }
  } else {
    return core::Error{"pre_tokenizer '" + (t.empty() ? j.dump().substr(0, 60) : t) + "' is not supported"};
  }
  steps.push_back(std::move(step));
  return core::Status::ok();
}

core::Expected<AddedToken> parse_added_token(const json& j) {
  if (!j.is_object()) return core::Error{"added token must be an object"};
  auto c = j.find("content");
  if (c == j.end() || !c->is_string()) return core::Error{"added token without a string 'content'"};
  AddedToken t;
  t.content = c->get<std::string>();
  t.single_word = get_bool(j, "single_word", false);
  t.lstrip = get_bool(j, "lstrip", false);
  t.rstrip = get_bool(j, "rstrip", false);
  t.special = get_bool(j, "special", false);
  t.normalized = get_bool(j, "normalized", !t.special);
  return t;
}

// tokenizer_config.json names special tokens as a string or as an AddedToken object.
std::optional<std::string> config_token(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

core::Expected<std::string> read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return core::Error{p.string() + ": cannot open"};
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return core::Error{p.string() + ": read error"};
  return ss.str();
}

}  // namespace

struct Tokenizer::Impl {
  BpeModel model;
  AddedVocabulary added;
  Normalizer normalizer;
  PreTokenizer pre;
  bool has_pre = false;
  DecoderKind decoder = DecoderKind::kNone;

  // Per id: flags and the decoded bytes (tokens_[off[id]..off[id+1])).
  enum : uint8_t { kExists = 1, kSpecial = 2, kAdded = 4 };
  std::vector<uint8_t> flags;
  std::vector<uint32_t> off;
  std::string bytes;

  std::optional<std::string> eos, bos, pad;

  struct Shard {
    std::mutex mu;
    std::unique_ptr<EncodeState> state;
  };
  mutable std::array<Shard, kShards> shards;

  void finish_tables();
  void encode_with(EncodeState& st, std::string_view text, std::vector<int32_t>& out,
                   std::span<const TextSpan> literal = {}) const;
  void encode_sharded(std::string_view text, std::vector<int32_t>& out,
                      std::span<const TextSpan> literal) const;
  void encode_text(EncodeState& st, std::string_view text, std::vector<int32_t>& out) const;
  // tokenizers' simple_id_to_token, then the model.
  const std::string* token_string(int32_t id) const {
    if (const std::string* s = added.decode_form(id)) return s;
    return model.id_to_token(id);
  }
};

void Tokenizer::Impl::finish_tables() {
  size_t limit = model.id_limit();
  for (const auto& [id, t] : added.tokens_by_id()) limit = std::max(limit, static_cast<size_t>(id) + 1);
  flags.assign(limit, 0);
  off.assign(limit + 1, 0);
  bytes.clear();
  const auto& alpha = ByteLevelAlphabet::get();
  std::string tmp;
  for (size_t id = 0; id < limit; ++id) {
    off[id] = static_cast<uint32_t>(bytes.size());
    const std::string* tok = token_string(static_cast<int32_t>(id));
    if (tok == nullptr) continue;
    uint8_t f = kExists;
    if (added.is_special(*tok)) f |= kSpecial;
    if (added.token_of(static_cast<int32_t>(id)) != nullptr) f |= kAdded;
    flags[id] = f;
    if (decoder == DecoderKind::kByteLevel) {
      // tokenizers' ByteLevel decoder: a token whose characters are all in the alphabet gives their bytes,
      // any other token its own UTF-8.
      tmp.clear();
      if (alpha.decode(*tok, tmp))
        bytes += tmp;
      else
        bytes += *tok;
    } else {
      bytes += *tok;
    }
  }
  off[limit] = static_cast<uint32_t>(bytes.size());
}

namespace {

struct EmitCtx {
  const BpeModel* model;
  EncodeState* st;
  std::vector<int32_t>* out;
};

void emit_piece(void* p, std::string_view piece) {
  auto* c = static_cast<EmitCtx*>(p);
  c->model->tokenize(piece, c->st->bpe, &c->st->cache, *c->out);
}

}  // namespace

void Tokenizer::Impl::encode_text(EncodeState& st, std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (!has_pre) {
    model.tokenize(text, st.bpe, &st.cache, out);
    return;
  }
  EmitCtx ctx{&model, &st, &out};
  pre.run(text, st.pre, emit_piece, &ctx);
}

void Tokenizer::Impl::encode_sharded(std::string_view text, std::vector<int32_t>& out,
                                     std::span<const TextSpan> literal) const {
  // Take a free shard, starting from one picked by thread so that threads tend to keep their own cache.
  const size_t start = std::hash<std::thread::id>{}(std::this_thread::get_id()) % kShards;
  for (size_t k = 0; k < kShards; ++k) {
    Shard& sh = shards[(start + k) % kShards];
    std::unique_lock<std::mutex> lock(sh.mu, std::try_to_lock);
    if (!lock.owns_lock()) continue;
    if (!sh.state) sh.state = std::make_unique<EncodeState>(size_t{1} << 15);
    encode_with(*sh.state, text, out, literal);
    return;
  }
  EncodeState local(64);
  encode_with(local, text, out, literal);
}

void Tokenizer::Impl::encode_with(EncodeState& st, std::string_view text, std::vector<int32_t>& out,
                                  std::span<const TextSpan> literal) const {
  // 1. Non-normalized added tokens on the raw text; 2. normalize the rest; 3. normalized added tokens;
  // 4. pre-tokenize and run the model on what remains (tokenizers: AddedVocabulary::extract_and_normalize).
  auto& raw = st.raw_splits;
  if (added.has_tokens(false)) {
    added.split(text, false, raw, literal);
  } else {
    raw.clear();
    if (!text.empty()) raw.push_back({0, text.size(), -1});
  }
  for (const auto& sp : raw) {
    if (sp.id >= 0) {
      out.push_back(sp.id);
      continue;
    }
    const std::string_view seg = text.substr(sp.begin, sp.end - sp.begin);
    const std::string_view norm = normalizer.empty() ? seg : normalizer.apply(seg, st.norm_buf);
    if (!added.has_tokens(true)) {
      encode_text(st, norm, out);
      continue;
    }
    auto& ns = st.norm_splits;
    const bool holds_literal = std::any_of(literal.begin(), literal.end(), [&](const TextSpan& l) {
      return l.begin < sp.end && sp.begin < l.end;
    });
    added.split(norm, true, ns, {}, holds_literal);
    for (const auto& n : ns) {
      if (n.id >= 0)
        out.push_back(n.id);
      else
        encode_text(st, norm.substr(n.begin, n.end - n.begin), out);
    }
  }
}

// ---- Tokenizer ----

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

core::Expected<Tokenizer> Tokenizer::load(const std::string& model_dir) {
  namespace fs = std::filesystem;
  const fs::path dir(model_dir);
  const fs::path tj = dir / "tokenizer.json";
  std::error_code ec;
  if (!fs::is_regular_file(tj, ec)) return core::Error{"no tokenizer.json in " + model_dir};
  DF_ASSIGN(std::string text, read_file(tj));
  std::string config;
  const fs::path cj = dir / "tokenizer_config.json";
  if (fs::is_regular_file(cj, ec)) {
    DF_ASSIGN(config, read_file(cj));
  }
  auto tok = load_from_json_text(text, config);
  if (!tok) return core::Error{tj.string() + ": " + tok.message()};
  return tok;
}

core::Expected<Tokenizer> Tokenizer::load_from_json_text(std::string_view tokenizer_json,
                                                         std::string_view config_json) {
  auto impl = std::make_unique<Impl>();
  try {
    const json j = json::parse(tokenizer_json);
    if (!j.is_object()) return core::Error{"tokenizer.json must be a JSON object"};

    // Model.
    auto mit = j.find("model");
    if (mit == j.end() || !mit->is_object()) return core::Error{"tokenizer.json has no 'model' object"};
    const json& m = *mit;
    std::string mtype = type_of(m);
    if (mtype.empty() && m.contains("merges")) mtype = "BPE";
    if (mtype != "BPE")
      return core::Error{"model type '" + (mtype.empty() ? std::string("?") : mtype) +
                         "' is not supported (only BPE)"};
    if (auto d = m.find("dropout"); d != m.end() && !d->is_null()) {
      if (!d->is_number()) return core::Error{"BPE dropout must be a number or null"};
      if (d->get<double>() > 0.0) return core::Error{"BPE dropout is not supported"};
    }
    auto vit = m.find("vocab");
    if (vit == m.end() || !vit->is_object()) return core::Error{"BPE model has no 'vocab' object"};
    StringIdMap vocab;
    vocab.reserve(vit->size());
    int64_t max_id = -1;
    for (auto it = vit->begin(); it != vit->end(); ++it) {
      if (!it.value().is_number_integer())
        return core::Error{"vocab entry '" + it.key() + "' has a non-integer id"};
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= kMaxId) return core::Error{"vocab entry '" + it.key() + "' has id out of range"};
      max_id = std::max(max_id, id);
      vocab.insert_or_assign(it.key(), static_cast<int32_t>(id));
    }
    if (max_id >= static_cast<int64_t>(vocab.size()) * 4 + 4096)
      return core::Error{"vocab ids are too sparse (largest " + std::to_string(max_id) + " for " +
                         std::to_string(vocab.size()) + " entries)"};
    std::vector<std::pair<std::string, std::string>> merges;
    if (auto mg = m.find("merges"); mg != m.end() && !mg->is_null()) {
      if (!mg->is_array()) return core::Error{"BPE 'merges' must be an array"};
      merges.reserve(mg->size());
      // All strings ("a b", the legacy form) or all pairs; tokenizers rejects a mix.
      const bool legacy = !mg->empty() && (*mg)[0].is_string();
      for (const auto& e : *mg) {
        if (legacy) {
          if (!e.is_string()) return core::Error{"BPE merges mix strings and pairs"};
          const std::string& line = e.get_ref<const std::string&>();
          if (line.rfind("#version", 0) == 0) continue;
          const size_t sp = line.find(' ');
          if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
            return core::Error{"BPE merge " + std::to_string(merges.size() + 1) + " '" + line +
                               "' is not two tokens separated by one space"};
          merges.emplace_back(line.substr(0, sp), line.substr(sp + 1));
        } else {
          if (!e.is_array() || e.size() != 2 || !e[0].is_string() || !e[1].is_string())
            return core::Error{"BPE merge " + std::to_string(merges.size()) + " is not a pair of strings"};
          merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
        }
      }
    }
    BpeOptions opt;
    opt.unk_token = get_opt_string(m, "unk_token");
    opt.continuing_subword_prefix = get_opt_string(m, "continuing_subword_prefix").value_or("");
    opt.end_of_word_suffix = get_opt_string(m, "end_of_word_suffix").value_or("");
    opt.fuse_unk = get_bool(m, "fuse_unk", false);
    opt.byte_fallback = get_bool(m, "byte_fallback", false);
    opt.ignore_merges = get_bool(m, "ignore_merges", false);

    // Normalizer.
    std::vector<NormalForm> forms;
    if (auto n = j.find("normalizer"); n != j.end()) DF_TRY(parse_normalizer(*n, forms));
    impl->normalizer = Normalizer(std::move(forms));

    // Pre-tokenizer.
    std::vector<PreTokenizerStep> steps;
    if (auto p = j.find("pre_tokenizer"); p != j.end()) DF_TRY(parse_pre_tokenizer(*p, steps));
    for (size_t i = 0; i + 1 < steps.size(); ++i)
      if (steps[i].kind == PreTokenizerStep::Kind::kByteLevel)
        return core::Error{"pre_tokenizer: ByteLevel is only supported as the last step of a Sequence"};
    impl->has_pre = !steps.empty();
    impl->pre = PreTokenizer(std::move(steps));

    // Decoder.
    if (auto d = j.find("decoder"); d != j.end() && !d->is_null()) {
      const std::string t = type_of(*d);
      if (t != "ByteLevel")
        return core::Error{"decoder '" + (t.empty() ? d->dump().substr(0, 60) : t) + "' is not supported"};
      impl->decoder = DecoderKind::kByteLevel;
    }

    DF_ASSIGN(impl->model, BpeModel::build(std::move(vocab), merges, std::move(opt), impl->pre.byte_level()));

    // Added tokens (ids are reassigned as tokenizers does on load).
    std::vector<AddedToken> added;
    if (auto a = j.find("added_tokens"); a != j.end() && !a->is_null()) {
      if (!a->is_array()) return core::Error{"'added_tokens' must be an array"};
      for (const auto& e : *a) {
        auto t = parse_added_token(e);
        if (!t) return core::Error{"added_tokens: " + t.message()};
        added.push_back(std::move(t).value());
      }
    }
    impl->added.add_tokens(added, impl->model, impl->normalizer);

    // tokenizer_config.json.
    if (!config_json.empty()) {
      json cfg;
      try {
        cfg = json::parse(config_json);
      } catch (const json::exception& e) {
        return core::Error{std::string("tokenizer_config.json: invalid JSON: ") + e.what()};
      }
      if (!cfg.is_object()) return core::Error{"tokenizer_config.json must be a JSON object"};
      impl->eos = config_token(cfg, "eos_token");
      impl->bos = config_token(cfg, "bos_token");
      impl->pad = config_token(cfg, "pad_token");
      if (auto atd = cfg.find("added_tokens_decoder"); atd != cfg.end() && atd->is_object()) {
        // transformers adds entries that tokenizer.json lacks, in id order.
        std::vector<std::pair<long long, AddedToken>> extra;
        for (auto it = atd->begin(); it != atd->end(); ++it) {
          auto t = parse_added_token(it.value());
          if (!t) return core::Error{"tokenizer_config.json added_tokens_decoder: " + t.message()};
          if (impl->added.token_to_id(t->content)) continue;
          long long key = 0;
          try {
            key = std::stoll(it.key());
          } catch (...) {
            return core::Error{"tokenizer_config.json added_tokens_decoder: key '" + it.key() +
                               "' is not an id"};
          }
          extra.emplace_back(key, std::move(t).value());
        }
        std::sort(extra.begin(), extra.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
        if (!extra.empty()) {
          std::vector<AddedToken> more;
          for (auto& [k, t] : extra) more.push_back(std::move(t));
          impl->added.add_tokens(more, impl->model, impl->normalizer);
        }
      }
    }
  } catch (const json::exception& e) {
    return core::Error{std::string("invalid tokenizer JSON: ") + e.what()};
  } catch (const std::exception& e) {
    return core::Error{std::string("invalid tokenizer JSON: ") + e.what()};
  }
  impl->finish_tables();
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  encode_append(text, out);
  return out;
}

void Tokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = utf8_lossy(text);
    text = repaired;
  }
  out.reserve(out.size() + text.size() / 4 + 4);
  impl_->encode_sharded(text, out, {});
}

std::vector<int32_t> Tokenizer::encode_literal(std::string_view text,
                                               std::span<const TextSpan> literal) const {
  if (literal.empty()) return encode(text);
  std::string repaired;
  std::vector<TextSpan> moved;
  if (!is_valid_utf8(text)) {
    // Repair the text between the ranges (special-token spellings are valid UTF-8) and move the ranges.
    size_t at = 0;
    for (const TextSpan& l : literal) {
      append_utf8_lossy(repaired, text.substr(at, l.begin - at));
      moved.push_back({repaired.size(), repaired.size() + (l.end - l.begin)});
      append_utf8_lossy(repaired, text.substr(l.begin, l.end - l.begin));
      at = l.end;
    }
    append_utf8_lossy(repaired, text.substr(at));
    text = repaired;
    literal = moved;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 4);
  impl_->encode_sharded(text, out, literal);
  return out;
}

std::vector<std::string> Tokenizer::special_token_texts() const {
  std::vector<std::string> out;
  for (const auto& [id, t] : impl_->added.tokens_by_id())
    if (t.special) out.push_back(t.content);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& d = *impl_;
  std::string bytes;
  bool first = true;
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= d.flags.size()) continue;
    const uint8_t f = d.flags[static_cast<size_t>(id)];
    if (!(f & Impl::kExists)) continue;
    if (skip_special_tokens && (f & Impl::kSpecial)) continue;
    if (d.decoder == DecoderKind::kNone && !first) bytes.push_back(' ');
    first = false;
    bytes.append(d.bytes, d.off[static_cast<size_t>(id)],
                 d.off[static_cast<size_t>(id) + 1] - d.off[static_cast<size_t>(id)]);
  }
  if (d.decoder == DecoderKind::kByteLevel && !is_valid_utf8(bytes)) return utf8_lossy(bytes);
  return bytes;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = impl_->added.token_to_id(token)) return id;
  return impl_->model.token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = impl_->token_string(id);
  if (s == nullptr) return std::nullopt;
  return *s;
}

size_t Tokenizer::vocab_size() const {
  return impl_->flags.size();
}

bool Tokenizer::has_id(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->flags.size() &&
         (impl_->flags[static_cast<size_t>(id)] & Impl::kExists);
}

bool Tokenizer::is_special(int32_t id) const {
  return has_id(id) && (impl_->flags[static_cast<size_t>(id)] & Impl::kSpecial);
}

bool Tokenizer::is_added(int32_t id) const {
  return has_id(id) && (impl_->flags[static_cast<size_t>(id)] & Impl::kAdded);
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (!has_id(id)) return {};
  const auto i = static_cast<size_t>(id);
  return std::string_view(impl_->bytes).substr(impl_->off[i], impl_->off[i + 1] - impl_->off[i]);
}

bool Tokenizer::decoder_joins_with_space() const {
  return impl_->decoder == DecoderKind::kNone;
}

const std::optional<std::string>& Tokenizer::eos_token() const {
  return impl_->eos;
}
const std::optional<std::string>& Tokenizer::bos_token() const {
  return impl_->bos;
}
const std::optional<std::string>& Tokenizer::pad_token() const {
  return impl_->pad;
}

std::optional<int32_t> Tokenizer::eos_token_id() const {
  return impl_->eos ? token_to_id(*impl_->eos) : std::nullopt;
}
std::optional<int32_t> Tokenizer::bos_token_id() const {
  return impl_->bos ? token_to_id(*impl_->bos) : std::nullopt;
}
std::optional<int32_t> Tokenizer::pad_token_id() const {
  return impl_->pad ? token_to_id(*impl_->pad) : std::nullopt;
}

}  // namespace deltaflow::text
