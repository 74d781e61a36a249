// The images of a request (docs/architecture.md §6): OpenAI `image_url` parts (data: URLs; local files only
// under --allowed-local-media-path; http(s) is refused, there is no network) and Ollama base64 `images`,
// decoded and preprocessed for the engine. A bad image, too many, or a model that cannot take images is a 400
// naming the field; nothing here can bring the server down.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/image_prompt.hpp"
#include "server/image_options.hpp"
#include "server/request_params.hpp"
#include "server/served_model.hpp"

namespace deltaflow::server {

// The image_url parts of normalised messages, in the order the template renders them, each with its field.
struct ImageRef {
  std::string field, url;
};
std::vector<ImageRef> message_image_urls(const Json& messages);

// Loads the images (none: nothing is checked) and expands the prompt's image placeholders to their token
// counts (text/vision_placeholders.hpp). `field` names the request field in errors about the whole set.
Parsed<std::vector<engine::ImageInput>> load_prompt_images(const std::vector<ImageRef>& refs,
                                                           const ServedModel& m, const ImageOptions& o,
                                                           const std::string& field,
                                                           std::vector<int32_t>& prompt);

}  // namespace deltaflow::server
