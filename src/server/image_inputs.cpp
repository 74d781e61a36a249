#include "server/image_inputs.hpp"

#include <filesystem>
#include <fstream>
#include <iterator>

#include "server/base64.hpp"
#include "text/vision_placeholders.hpp"
#include "vision/image_decode.hpp"
#include "vision/preprocess.hpp"

namespace deltaflow::server {

namespace fs = std::filesystem;

namespace {

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}

// The bytes behind an image URL.
Parsed<std::vector<uint8_t>> url_bytes(const ImageRef& ref, const ImageOptions& o, size_t max_bytes) {
  const std::string& url = ref.url;
  if (starts_with(url, "data:")) {
    const size_t comma = url.find(',');
    if (comma == std::string::npos || url.substr(0, comma).find(";base64") == std::string::npos)
      return bad_field(ref.field, "a data: URL must be base64 (data:<type>;base64,<data>)");
    auto bytes = base64_decode(std::string_view(url).substr(comma + 1));
    if (!bytes) return bad_field(ref.field, "the data: URL's data is not valid base64");
    return std::move(*bytes);
  }
  if (starts_with(url, "http://") || starts_with(url, "https://"))
    return bad_field(ref.field,
                     "image URLs over the network are not supported (this server has no network): "
                     "send the image as a data: URL");
  std::string path = url;
  if (starts_with(path, "file://")) path = path.substr(7);
  if (path.empty() || path[0] != '/')
    return bad_field(ref.field, "an image URL must be a data: URL, a file:// URL or an absolute path");
  if (o.allowed_local_media_path.empty())
    return bad_field(ref.field,
                     "local image files are not allowed (start the server with "
                     "--allowed-local-media-path DIR)");
  std::error_code ec;
  const fs::path root = fs::canonical(o.allowed_local_media_path, ec);
  const fs::path file = ec ? fs::path() : fs::canonical(path, ec);
  const std::string r = root.string() + "/";
  if (ec || file.string().compare(0, r.size(), r) != 0)
    return bad_field(ref.field, "the image file is not an existing file under --allowed-local-media-path");
  if (!fs::is_regular_file(file, ec) || fs::file_size(file, ec) > max_bytes)
    return bad_field(
        ref.field, "the image file is not a regular file of at most " + std::to_string(max_bytes) + " bytes");
  std::ifstream in(file, std::ios::binary);
  if (!in) return bad_field(ref.field, "the image file cannot be read");
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Parsed<engine::ImageInput> load_one(const ImageRef& ref, const ServedModel& m, const ImageOptions& o) {
  vision::DecodeLimits limits;
  if (o.max_image_pixels > 0) limits.max_pixels = std::min(limits.max_pixels, o.max_image_pixels);
  auto bytes = url_bytes(ref, o, static_cast<size_t>(limits.max_input_bytes));
  if (auto* e = std::get_if<ApiError>(&bytes)) return *e;
  auto image = vision::decode_image(std::get<std::vector<uint8_t>>(bytes), limits);
  if (!image) return bad_field(ref.field, "bad image: " + image.message());
  auto pv = vision::preprocess_image(*image, m.processor());
  if (!pv) return bad_field(ref.field, "bad image: " + pv.message());
  engine::ImageInput in;
  in.grid = {pv->grid_t, pv->grid_h, pv->grid_w};
  in.pixel_values = std::move(pv->data);
  in.hash = engine::image_content_hash(in.pixel_values, in.grid);
  return in;
}

}  // namespace

std::vector<ImageRef> message_image_urls(const Json& messages) {
  std::vector<ImageRef> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const auto it = messages[i].find("content");
    if (it == messages[i].end() || !it->is_array()) continue;
    for (size_t k = 0; k < it->size(); ++k) {
      const Json& part = (*it)[k];
      if (part.value("type", "") != "image_url") continue;
      const Json& iu = part["image_url"];
      out.push_back({"messages[" + std::to_string(i) + "].content[" + std::to_string(k) + "].image_url",
                     iu.is_string() ? iu.get<std::string>() : iu["url"].get<std::string>()});
    }
  }
  return out;
}

Parsed<std::vector<engine::ImageInput>> load_prompt_images(const std::vector<ImageRef>& refs,
                                                           const ServedModel& m, const ImageOptions& o,
                                                           const std::string& field,
                                                           std::vector<int32_t>& prompt) {
  std::vector<engine::ImageInput> images;
  if (refs.empty()) return images;
  if (!m.vision()) return bad_field(field, "this model cannot take images: " + m.vision_error());
  if (static_cast<int64_t>(refs.size()) > o.limit_per_prompt)
    return bad_field(field, std::to_string(refs.size()) + " images exceed --limit-mm-per-prompt " +
                                std::to_string(o.limit_per_prompt));
  std::vector<int64_t> counts;
  for (const auto& ref : refs) {
    auto in = load_one(ref, m, o);
    if (auto* e = std::get_if<ApiError>(&in)) return *e;
    auto& image = std::get<engine::ImageInput>(in);
    counts.push_back(image.grid.t * image.grid.h * image.grid.w / m.vision()->merge_unit());
    images.push_back(std::move(image));
  }
  auto expanded =
      text::expand_vision_placeholders(prompt, static_cast<int32_t>(m.vision()->image_token_id), counts);
  if (!expanded) return bad_field(field, "the rendered prompt's image placeholders: " + expanded.message());
  prompt = std::move(*expanded);
  return images;
}

}  // namespace deltaflow::server
