#include "model/quant/config.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

namespace deltaflow::model::quant {
namespace {

using nlohmann::json;

core::Expected<json> parse_json(std::string_view text, const std::string& where) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded()) return core::Error{where + ": not valid JSON"};
  if (!j.is_object()) return core::Error{where + ": expected a JSON object"};
  return j;
}

// A string field, "" when absent or null; another type is an error.
core::Expected<std::string> opt_string(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return std::string();
  if (!it->is_string()) return core::Error{where + ": field '" + key + "' must be a string"};
  return it->get<std::string>();
}

core::Expected<int64_t> opt_int(const json& o, const char* key, int64_t dflt, const std::string& where) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return dflt;
  if (!it->is_number_integer()) return core::Error{where + ": field '" + key + "' must be an integer"};
  return it->get<int64_t>();
}

core::Expected<std::vector<std::string>> opt_strings(const json& o, const char* key,
                                                     const std::string& where) {
  std::vector<std::string> out;
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return out;
  if (it->is_string()) return std::vector<std::string>{it->get<std::string>()};
  if (!it->is_array()) return core::Error{where + ": field '" + key + "' must be a list of strings"};
  for (const auto& v : *it) {
    if (!v.is_string()) return core::Error{where + ": field '" + key + "' must be a list of strings"};
    out.push_back(v.get<std::string>());
  }
  return out;
}

core::Expected<std::vector<NamePattern>> patterns(const std::vector<std::string>& texts,
                                                  NamePattern::Kind kind, const std::string& where) {
  std::vector<NamePattern> out;
  for (const auto& t : texts) {
    DF_ASSIGN(NamePattern p, NamePattern::make(kind, t, where));
    out.push_back(std::move(p));
  }
  return out;
}

// compressed-tensors names: "re:<regex>", "Linear" (the class every module we ask about has), or exact.
core::Expected<std::vector<NamePattern>> ct_patterns(const std::vector<std::string>& texts,
                                                     const std::string& where) {
  std::vector<NamePattern> out;
  for (const auto& t : texts) {
    NamePattern::Kind kind = NamePattern::Kind::kExact;
    std::string body = t;
    if (t.rfind("re:", 0) == 0) {
      kind = NamePattern::Kind::kRegex;
      body = t.substr(3);
    } else if (t == "Linear") {
      kind = NamePattern::Kind::kLinearClass;
    }
    DF_ASSIGN(NamePattern p, NamePattern::make(kind, body, where));
    out.push_back(std::move(p));
  }
  return out;
}

LinearScheme unsupported(std::string algo) {
  LinearScheme s;
  s.supported = false;
  s.algo = std::move(algo);
  return s;
}

// A ModelOpt quant_algo for one layer (or the whole model).
LinearScheme modelopt_scheme(const std::string& algo) {
  LinearScheme s;
  s.algo = "modelopt " + algo;
  if (algo == "NVFP4" || algo == "W4A8_NVFP4_FP8") {
    s.format = WeightFormat::kNvfp4;
    s.input_scale = true;
  } else if (algo == "W4A16_NVFP4") {
    s.format = WeightFormat::kNvfp4;
  } else if (algo == "FP8") {
    s.format = WeightFormat::kFp8;
    s.fp8_scales = Fp8Scales::kTensor;
    s.input_scale = true;
  } else if (algo == "FP8_PB_WO") {
    s.format = WeightFormat::kFp8;
    s.fp8_scales = Fp8Scales::kBlock;
  } else {
    return unsupported("modelopt " + (algo.empty() ? std::string("(no quant_algo)") : algo));
  }
  return s;
}

// One compressed-tensors scheme: {weights, input_activations} under the group's (or the file's) format.
core::Expected<LinearScheme> ct_scheme(const json& g, const std::string& format, const std::string& where) {
  auto w = g.find("weights");
  if (w == g.end() || w->is_null()) return unsupported("compressed-tensors " + format + " without weights");
  if (!w->is_object()) return core::Error{where + ": field 'weights' must be an object"};
  DF_ASSIGN(int64_t bits, opt_int(*w, "num_bits", 0, where));
  DF_ASSIGN(std::string type, opt_string(*w, "type", where));
  DF_ASSIGN(std::string strategy, opt_string(*w, "strategy", where));
  DF_ASSIGN(int64_t group, opt_int(*w, "group_size", 0, where));
  LinearScheme s;
  s.algo = "compressed-tensors " + format + " (" + std::to_string(bits) + "-bit " + type +
           (strategy.empty() ? "" : ", " + strategy) + ")";
  auto in = g.find("input_activations");
  if (in != g.end() && in->is_object()) {
    auto d = in->find("dynamic");
    s.input_scale = !(d != in->end() && d->is_boolean() && d->get<bool>());
  }
  if (format == "nvfp4-pack-quantized") {
    if (bits != 4 || type != "float" || group != kNvfp4Group)
      return unsupported(s.algo + ", expected 4-bit float group 16");
    s.format = WeightFormat::kNvfp4;
    return s;
  }
  if (format == "float-quantized" || format == "naive-quantized") {
    if (bits != 8 || type != "float") return unsupported(s.algo);
    s.format = WeightFormat::kFp8;
    if (strategy == "tensor") {
      s.fp8_scales = Fp8Scales::kTensor;
    } else if (strategy == "channel") {
      s.fp8_scales = Fp8Scales::kChannel;
    } else if (strategy == "block") {
      s.fp8_scales = Fp8Scales::kBlock;
      auto bs = w->find("block_structure");
      if (bs == w->end() || !bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
          !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() <= 0 || (*bs)[1].get<int64_t>() <= 0)
        return core::Error{where +
                           ": FP8 block strategy needs 'block_structure' [rows, cols] of positive integers"};
      s.block_rows = (*bs)[0].get<int64_t>();
      s.block_cols = (*bs)[1].get<int64_t>();
    } else {
      return unsupported(s.algo);
    }
    return s;
  }
  return unsupported(s.algo);
}

core::Expected<QuantConfig> parse_modelopt(const json& q, const json* top, const std::string& where) {
  QuantConfig c;
  c.convention = Convention::kModelOpt;
  c.where = where;
  DF_ASSIGN(std::string algo, opt_string(q, "quant_algo", where));
  DF_ASSIGN(std::string kv, opt_string(q, "kv_cache_quant_algo", where));
  std::vector<std::string> excl;
  for (const char* key : {"exclude_modules", "ignore"}) {
    DF_ASSIGN(std::vector<std::string> e, opt_strings(q, key, where));
    excl.insert(excl.end(), e.begin(), e.end());
  }
  DF_ASSIGN(c.exclude, patterns(excl, NamePattern::Kind::kGlob, where));
  c.summary = "modelopt " + algo;
  if (top) {
    auto p = top->find("producer");
    if (p != top->end() && p->is_object()) {
      DF_ASSIGN(std::string version, opt_string(*p, "version", where));
      if (!version.empty()) c.summary += " (modelopt " + version + ")";
    }
  }
  if (!kv.empty()) c.summary += ", kv cache " + kv;
  if (algo == "MIXED_PRECISION") {
    auto layers = q.find("quantized_layers");
    if (layers != q.end() && !layers->is_null()) {
      if (!layers->is_object()) return core::Error{where + ": field 'quantized_layers' must be an object"};
      for (const auto& [name, v] : layers->items()) {
        if (!v.is_object())
          return core::Error{where + ": quantized_layers['" + name + "'] must be an object"};
        DF_ASSIGN(std::string la, opt_string(v, "quant_algo", where + ": quantized_layers['" + name + "']"));
        DF_ASSIGN(NamePattern p, NamePattern::make(NamePattern::Kind::kGlob, name, where));
        c.layers.emplace_back(std::move(p), modelopt_scheme(la));
      }
    } else {
      // config.json written by ModelOpt's converter: config_groups with module-name targets.
      auto groups = q.find("config_groups");
      if (groups == q.end() || !groups->is_object())
        return core::Error{where + ": MIXED_PRECISION needs 'quantized_layers' or 'config_groups'"};
      for (const auto& [gname, g] : groups->items()) {
        if (!g.is_object()) return core::Error{where + ": config_groups['" + gname + "'] must be an object"};
        auto w = g.find("weights");
        DF_ASSIGN(int64_t bits, w != g.end() && w->is_object() ? opt_int(*w, "num_bits", 0, where)
                                                               : core::Expected<int64_t>(int64_t{0}));
        auto in = g.find("input_activations");
        const bool acts = in != g.end() && in->is_object();
        LinearScheme s = modelopt_scheme(bits == 4   ? (acts ? "NVFP4" : "W4A16_NVFP4")
                                         : bits == 8 ? "FP8"
                                                     : "");
        DF_ASSIGN(std::vector<std::string> targets, opt_strings(g, "targets", where));
        for (const auto& t : targets) {
          DF_ASSIGN(NamePattern p, NamePattern::make(NamePattern::Kind::kGlob, t, where));
          c.layers.emplace_back(std::move(p), s);
        }
      }
    }
    c.uniform = LinearScheme{};  // unlisted modules stay in their stored dtype
  } else {
    c.uniform = modelopt_scheme(algo);
  }
  return c;
}

core::Expected<QuantConfig> parse_compressed_tensors(const json& q, const std::string& where) {
  QuantConfig c;
  c.convention = Convention::kCompressedTensors;
  c.where = where;
  DF_ASSIGN(std::string format, opt_string(q, "format", where));
  DF_ASSIGN(std::string status, opt_string(q, "quantization_status", where));
  c.summary = "compressed-tensors " + format;
  DF_ASSIGN(std::vector<std::string> ign, opt_strings(q, "ignore", where));
  DF_ASSIGN(c.ignore, ct_patterns(ign, where));
  auto groups = q.find("config_groups");
  if (groups == q.end() || groups->is_null()) return core::Error{where + ": missing field 'config_groups'"};
  if (!groups->is_object()) return core::Error{where + ": field 'config_groups' must be an object"};
  for (const auto& [gname, g] : groups->items()) {
    const std::string gw = where + ": config_groups['" + gname + "']";
    if (!g.is_object()) return core::Error{gw + " must be an object"};
    DF_ASSIGN(std::string gformat, opt_string(g, "format", gw));
    if (gformat.empty()) gformat = format;
    QuantConfig::Group grp;
    DF_ASSIGN(std::vector<std::string> targets, opt_strings(g, "targets", gw));
    DF_ASSIGN(grp.targets, ct_patterns(targets, gw));
    DF_ASSIGN(grp.scheme, ct_scheme(g, gformat, gw));
    if (!status.empty() && status != "compressed")
      grp.scheme = unsupported("compressed-tensors quantization_status '" + status + "' (not compressed)");
    c.groups.push_back(std::move(grp));
  }
  return c;
}

core::Expected<QuantConfig> parse_qwen_fp8(const json& q, const std::string& where) {
  QuantConfig c;
  c.convention = Convention::kQwenFp8;
  c.where = where;
  DF_ASSIGN(std::string fmt, opt_string(q, "fmt", where));
  if (!fmt.empty() && fmt != "e4m3") {
    c.uniform = unsupported("fp8 fmt '" + fmt + "'");
  } else {
    c.uniform.format = WeightFormat::kFp8;
    c.uniform.fp8_scales = Fp8Scales::kBlock;
    c.uniform.algo = "fp8 block";
    auto bs = q.find("weight_block_size");
    if (bs != q.end() && !bs->is_null()) {
      if (!bs->is_array() || bs->size() != 2 || !(*bs)[0].is_number_integer() ||
          !(*bs)[1].is_number_integer() || (*bs)[0].get<int64_t>() <= 0 || (*bs)[1].get<int64_t>() <= 0)
        return core::Error{where + ": field 'weight_block_size' must be [rows, cols] of positive integers"};
      c.uniform.block_rows = (*bs)[0].get<int64_t>();
      c.uniform.block_cols = (*bs)[1].get<int64_t>();
    }
    DF_ASSIGN(std::string act, opt_string(q, "activation_scheme", where));
    c.uniform.input_scale = act == "static";
  }
  c.summary =
      "fp8 block " + std::to_string(c.uniform.block_rows) + "x" + std::to_string(c.uniform.block_cols);
  DF_ASSIGN(std::vector<std::string> keep, opt_strings(q, "modules_to_not_convert", where));
  DF_ASSIGN(c.exclude, patterns(keep, NamePattern::Kind::kHfPrefix, where));
  return c;
}

}  // namespace

core::Expected<NamePattern> NamePattern::make(Kind kind, std::string text, const std::string& where) {
  NamePattern p;
  p.kind_ = kind;
  p.text_ = std::move(text);
  if (kind == Kind::kRegex || kind == Kind::kHfPrefix) {
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(p.text_.data()), p.text_.size(),
                                     PCRE2_ANCHORED, &err, &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return core::Error{where + ": pattern 're:" + p.text_ +
                         "' does not compile: " + reinterpret_cast<const char*>(msg)};
    }
    p.regex_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
  }
  return p;
}

bool NamePattern::matches(std::string_view m) const {
  switch (kind_) {
    case Kind::kExact:
      return m == text_;
    case Kind::kGlob:
      return glob_match(text_, m);
    case Kind::kLinearClass:
      return true;
    case Kind::kHfPrefix:
      if (m.size() >= text_.size() && m.compare(m.size() - text_.size(), text_.size(), text_) == 0)
        return true;
      [[fallthrough]];
    case Kind::kRegex: {
      auto* code = static_cast<pcre2_code*>(regex_.get());
      pcre2_match_data* md = pcre2_match_data_create_from_pattern(code, nullptr);
      pcre2_match_context* mc = pcre2_match_context_create(nullptr);
      pcre2_set_match_limit(mc, 1'000'000);
      pcre2_set_depth_limit(mc, 10'000);
      const int rc = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(m.data()), m.size(), 0, 0, md, mc);
      pcre2_match_context_free(mc);
      pcre2_match_data_free(md);
      return rc >= 0;
    }
  }
  return false;
}

bool glob_match(std::string_view p, std::string_view t) {
  // Iterative matcher with one backtrack point for the last '*' (linear in practice, no recursion).
  size_t pi = 0, ti = 0, star = std::string_view::npos, mark = 0;
  auto one = [&](size_t& pj, char c) -> int {  // 1 match, 0 no match; advances pj past the token
    if (p[pj] == '?') {
      ++pj;
      return 1;
    }
    if (p[pj] == '[') {
      size_t j = pj + 1;
      bool neg = false;
      if (j < p.size() && p[j] == '!') {
        neg = true;
        ++j;
      }
      size_t k = j;
      if (k < p.size() && p[k] == ']') ++k;  // a leading ']' is literal
      while (k < p.size() && p[k] != ']') ++k;
      if (k >= p.size()) {  // no closing bracket: '[' is literal (as fnmatch.translate)
        ++pj;
        return c == '[' ? 1 : 0;
      }
      bool in = false;
      for (size_t i = j; i < k; ++i) {
        if (i + 2 < k && p[i + 1] == '-') {
          if (p[i] <= c && c <= p[i + 2]) in = true;
          i += 2;
        } else if (p[i] == c) {
          in = true;
        }
      }
      pj = k + 1;
      return in != neg ? 1 : 0;
    }
    return p[pj++] == c ? 1 : 0;
  };
  while (ti < t.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = ++pi;
      mark = ti;
      continue;
    }
    size_t pj = pi;
    if (pi < p.size() && one(pj, t[ti])) {
      pi = pj;
      ++ti;
      continue;
    }
    if (star == std::string_view::npos) return false;
    pi = star;
    ti = ++mark;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

LinearScheme QuantConfig::scheme_for(std::string_view module) const {
  switch (convention) {
    case Convention::kNone:
      return LinearScheme{};
    case Convention::kModelOpt:
      for (const auto& e : exclude)
        if (e.matches(module)) return LinearScheme{};
      if (!layers.empty()) {
        for (const auto& [p, s] : layers)
          if (p.matches(module)) return s;
        return LinearScheme{};
      }
      return uniform;
    case Convention::kQwenFp8:
      for (const auto& e : exclude)
        if (e.matches(module)) return LinearScheme{};
      return uniform;
    case Convention::kCompressedTensors:
      for (const auto& e : ignore)
        if (e.matches(module)) return LinearScheme{};
      // compressed-tensors prefers an exact name, then a regex, then the class name.
      for (auto kind :
           {NamePattern::Kind::kExact, NamePattern::Kind::kRegex, NamePattern::Kind::kLinearClass})
        for (const auto& g : groups)
          for (const auto& t : g.targets)
            if (t.kind() == kind && t.matches(module)) return g.scheme;
      return LinearScheme{};
  }
  return LinearScheme{};
}

core::Expected<QuantConfig> parse_hf_quant_config(std::string_view text, const std::string& where) {
  DF_ASSIGN(json j, parse_json(text, where));
  auto q = j.find("quantization");
  if (q == j.end() || !q->is_object()) return core::Error{where + ": missing object 'quantization'"};
  auto p = j.find("producer");
  if (p != j.end() && p->is_object()) {
    DF_ASSIGN(std::string name, opt_string(*p, "name", where));
    if (!name.empty() && name != "modelopt")
      return core::Error{where + ": producer '" + name + "' is not supported (expected modelopt)"};
  }
  return parse_modelopt(*q, &j, where);
}

core::Expected<QuantConfig> parse_quantization_config(std::string_view text, const std::string& where) {
  DF_ASSIGN(json q, parse_json(text, where));
  DF_ASSIGN(std::string method, opt_string(q, "quant_method", where));
  if (method == "modelopt") {
    auto nested = q.find("quantization");  // some exports copy hf_quant_config.json's object as it is
    if (nested != q.end() && nested->is_object()) return parse_modelopt(*nested, &q, where);
    return parse_modelopt(q, &q, where);
  }
  if (method == "compressed-tensors") return parse_compressed_tensors(q, where);
  if (method == "fp8") return parse_qwen_fp8(q, where);
  return core::Error{where + ": quantization_config quant_method '" + method +
                     "' is not supported (supported: modelopt, compressed-tensors, fp8)"};
}

}  // namespace deltaflow::model::quant
