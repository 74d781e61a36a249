// The vision weight table: HF names -> VisionWeights, mirroring Qwen3_5VisionModel's state dict
// (patch_embed.proj, pos_embed, blocks.N.{norm1,norm2,attn.qkv,attn.proj,mlp.linear_fc1,mlp.linear_fc2},
// merger.{norm,linear_fc1,linear_fc2}); no deepstack mergers in this family.
#include <set>

#include "model/vision_weights.hpp"

namespace deltaflow::model {
namespace {

class VisionBinder {
 public:
  VisionBinder(const io::Checkpoint& ck, std::string prefix) : ck_(ck), prefix_(std::move(prefix)) {}

  // `name` (under the prefix) with exactly `shape`, viewed as [shape[0], rest] (1-D as [1, n]).
  core::Expected<Mat> mat(const std::string& name, const std::vector<int64_t>& shape) {
    const std::string full = prefix_ + name;
    const io::Tensor* t = ck_.find(full);
    if (!t)
      return core::Error{ck_.dir() + ": missing vision tensor '" + full + "' (expected shape " +
                         io::shape_string(shape) + ")"};
    if (t->shape != shape)
      return core::Error{*t->file + ": vision tensor '" + full + "' has shape " + io::shape_string(t->shape) +
                         ", expected " + io::shape_string(shape)};
    if (t->dtype != core::DType::kBF16 && t->dtype != core::DType::kF16 && t->dtype != core::DType::kF32)
      return core::Error{*t->file + ": vision tensor '" + full + "' has dtype " +
                         std::string(core::dtype_name(t->dtype)) + ", expected BF16, F16 or F32"};
    used_.insert(full);
    Mat m;
    m.data = t->data;
    m.dtype = t->dtype;
    if (shape.size() == 1) {
      m.rows = 1;
      m.cols = shape[0];
    } else {
      m.rows = shape[0];
      m.cols = 1;
      for (size_t i = 1; i < shape.size(); ++i) m.cols *= shape[i];
    }
    return m;
  }

  core::Status check_all_used() const {
    for (const auto& t : ck_.tensors())
      if (t.name.rfind(prefix_, 0) == 0 && !used_.count(t.name))
        return core::Error{*t.file + ": unexpected vision tensor '" + t.name +
                           "' (not part of a Qwen3.5 vision tower with this config)"};
    return core::Status();
  }

 private:
  const io::Checkpoint& ck_;
  std::string prefix_;
  std::set<std::string> used_;
};

}  // namespace

core::Expected<VisionWeights> bind_vision_weights(const VisionConfig& c, const io::Checkpoint& ck) {
  VisionWeights w;
  for (const char* p : {"model.visual.", "visual."})
    if (ck.find(std::string(p) + "patch_embed.proj.weight")) {
      w.prefix = p;
      break;
    }
  if (w.prefix.empty())
    return core::Error{ck.dir() +
                       ": no vision tower: missing tensor 'model.visual.patch_embed.proj.weight' (this "
                       "checkpoint has no trained vision encoder, so it cannot take images)"};
  VisionBinder b(ck, w.prefix);
  const int64_t D = c.hidden_size, I = c.intermediate_size, M = D * c.merge_unit();
  DF_ASSIGN(w.patch_embed_w, b.mat("patch_embed.proj.weight",
                                   {D, c.in_channels, c.temporal_patch_size, c.patch_size, c.patch_size}));
  DF_ASSIGN(w.patch_embed_b, b.mat("patch_embed.proj.bias", {D}));
  DF_ASSIGN(w.pos_embed, b.mat("pos_embed.weight", {c.num_position_embeddings, D}));
  w.blocks.resize(static_cast<size_t>(c.depth));
  for (int64_t i = 0; i < c.depth; ++i) {
    auto& k = w.blocks[static_cast<size_t>(i)];
    const std::string p = "blocks." + std::to_string(i) + ".";
    DF_ASSIGN(k.norm1_w, b.mat(p + "norm1.weight", {D}));
    DF_ASSIGN(k.norm1_b, b.mat(p + "norm1.bias", {D}));
    DF_ASSIGN(k.qkv_w, b.mat(p + "attn.qkv.weight", {3 * D, D}));
    DF_ASSIGN(k.qkv_b, b.mat(p + "attn.qkv.bias", {3 * D}));
    DF_ASSIGN(k.proj_w, b.mat(p + "attn.proj.weight", {D, D}));
    DF_ASSIGN(k.proj_b, b.mat(p + "attn.proj.bias", {D}));
    DF_ASSIGN(k.norm2_w, b.mat(p + "norm2.weight", {D}));
    DF_ASSIGN(k.norm2_b, b.mat(p + "norm2.bias", {D}));
    DF_ASSIGN(k.fc1_w, b.mat(p + "mlp.linear_fc1.weight", {I, D}));
    DF_ASSIGN(k.fc1_b, b.mat(p + "mlp.linear_fc1.bias", {I}));
    DF_ASSIGN(k.fc2_w, b.mat(p + "mlp.linear_fc2.weight", {D, I}));
    DF_ASSIGN(k.fc2_b, b.mat(p + "mlp.linear_fc2.bias", {D}));
  }
  DF_ASSIGN(w.merger_norm_w, b.mat("merger.norm.weight", {D}));
  DF_ASSIGN(w.merger_norm_b, b.mat("merger.norm.bias", {D}));
  DF_ASSIGN(w.merger_fc1_w, b.mat("merger.linear_fc1.weight", {M, M}));
  DF_ASSIGN(w.merger_fc1_b, b.mat("merger.linear_fc1.bias", {M}));
  DF_ASSIGN(w.merger_fc2_w, b.mat("merger.linear_fc2.weight", {c.out_hidden_size, M}));
  DF_ASSIGN(w.merger_fc2_b, b.mat("merger.linear_fc2.bias", {c.out_hidden_size}));
  DF_TRY(b.check_all_used());
  return w;
}

}  // namespace deltaflow::model
