// JPEG through libjpeg-turbo with the library defaults Pillow decodes with (islow IDCT, fancy upsampling),
// so the pixels match Pillow's. Errors longjmp back into the phase functions, as in decode_png.cpp.
// jpeglib.h needs FILE and size_t declared first.
#include <cstdio>
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on

#include <csetjmp>
#include <cstring>
#include <memory>

#include "vision/image_decode.hpp"

namespace deltaflow::vision {
namespace {

constexpr int kMaxScans = 1000;  // progressive files with more scans are refused (a CPU-time bomb otherwise)

struct JpegContext {
  jpeg_decompress_struct cinfo;
  jpeg_error_mgr err;
  jpeg_progress_mgr progress;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {};
  bool truncated = false;
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* c = reinterpret_cast<JpegContext*>(cinfo->client_data);
  (*cinfo->err->format_message)(cinfo, c->message);
  std::longjmp(c->jump, 1);
}
// Warnings are ignored as Pillow ignores them, except the end of data before the image is complete: libjpeg
// pads with grey there, Pillow raises "image file is truncated".
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF)
    reinterpret_cast<JpegContext*>(cinfo->client_data)->truncated = true;
}

void on_jpeg_progress(j_common_ptr cinfo) {
  auto* d = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (d->input_scan_number > kMaxScans) {
    auto* c = reinterpret_cast<JpegContext*>(cinfo->client_data);
    std::snprintf(c->message, sizeof(c->message), "more than %d scans", kMaxScans);
    std::longjmp(c->jump, 1);
  }
}

bool read_header(JpegContext* c, const uint8_t* data, size_t size) {
  if (setjmp(c->jump)) return false;
  jpeg_mem_src(&c->cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&c->cinfo, TRUE);
  return true;
}

// Starts decompression in the colour space Pillow asks for: grey, CMYK (4 components) or RGB.
bool start(JpegContext* c) {
  if (setjmp(c->jump)) return false;
  if (c->cinfo.num_components == 1) {
    c->cinfo.out_color_space = JCS_GRAYSCALE;
  } else if (c->cinfo.num_components == 4) {
    c->cinfo.out_color_space = JCS_CMYK;
  } else {
    c->cinfo.out_color_space = JCS_RGB;
  }
  jpeg_start_decompress(&c->cinfo);
  return true;
}

bool read_lines(JpegContext* c, uint8_t* buf, size_t row_bytes) {
  if (setjmp(c->jump)) return false;
  while (c->cinfo.output_scanline < c->cinfo.output_height) {
    JSAMPROW row = buf + static_cast<size_t>(c->cinfo.output_scanline) * row_bytes;
    jpeg_read_scanlines(&c->cinfo, &row, 1);
  }
  jpeg_finish_decompress(&c->cinfo);
  return true;
}

// Pillow's MULDIV255 and cmyk2rgb (Convert.c) on its CMYK, which is the inverted Adobe data ("CMYK;I").
inline uint8_t muldiv255(int a, int b) {
  const int t = a * b + 128;
  return static_cast<uint8_t>(((t >> 8) + t) >> 8);
}

}  // namespace

core::Expected<Image> decode_jpeg(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  auto c = std::make_unique<JpegContext>();
  c->cinfo.err = jpeg_std_error(&c->err);
  c->err.error_exit = on_jpeg_error;
  c->err.emit_message = on_jpeg_message;
  c->cinfo.client_data = c.get();
  jpeg_create_decompress(&c->cinfo);
  struct Cleanup {
    JpegContext* c;
    ~Cleanup() { jpeg_destroy_decompress(&c->cinfo); }
  } cleanup{c.get()};
  c->progress.progress_monitor = on_jpeg_progress;
  c->cinfo.progress = &c->progress;
  if (!read_header(c.get(), bytes.data(), bytes.size()))
    return core::Error{std::string("invalid JPEG: ") + c->message};
  DF_TRY(check_image_size("JPEG", c->cinfo.image_width, c->cinfo.image_height, limits));
  const int comps = c->cinfo.num_components;
  if (comps != 1 && comps != 3 && comps != 4)
    return core::Error{"JPEG: unsupported number of components (" + std::to_string(comps) + ")"};
  if (!start(c.get())) return core::Error{std::string("invalid JPEG: ") + c->message};
  const int64_t w = c->cinfo.output_width, h = c->cinfo.output_height;
  const int oc = c->cinfo.output_components;
  if (w != c->cinfo.image_width || h != c->cinfo.image_height || (oc != 1 && oc != 3 && oc != 4))
    return core::Error{"JPEG: unexpected decoder output layout"};
  std::vector<uint8_t> raw(static_cast<size_t>(w * h * oc));
  if (!read_lines(c.get(), raw.data(), static_cast<size_t>(w * oc)))
    return core::Error{std::string("invalid JPEG: ") + c->message};
  if (c->truncated) return core::Error{"invalid JPEG: truncated data (the file ends inside the image)"};
  Image img;
  img.width = w;
  img.height = h;
  if (oc == 3) {
    img.rgb = std::move(raw);
    return img;
  }
  img.rgb.resize(static_cast<size_t>(w * h * 3));
  for (int64_t i = 0; i < w * h; ++i) {
    uint8_t* o = img.rgb.data() + 3 * i;
    if (oc == 1) {
      o[0] = o[1] = o[2] = raw[static_cast<size_t>(i)];
    } else {
      const uint8_t* p = raw.data() + 4 * i;
      const int nk = p[3];  // 255 - K in Pillow's (inverted) terms
      for (int ch = 0; ch < 3; ++ch) {
        const int v = nk - muldiv255(255 - p[ch], nk);
        o[ch] = static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
      }
    }
  }
  return img;
}

}  // namespace deltaflow::vision
