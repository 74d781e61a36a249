// PNG through libpng's low-level API. libpng reports errors by longjmp: every libpng call sits in a phase
// function whose locals are trivially destructible, and the buffers it fills are sized before the phase.
#include <png.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "vision/image_decode.hpp"

namespace deltaflow::vision {
namespace {

struct PngContext {
  const uint8_t* data = nullptr;
  size_t size = 0, pos = 0;
  char message[200] = {};
  png_structp png = nullptr;
  png_infop info = nullptr;
  png_uint_32 width = 0, height = 0;
  int bit_depth = 0, channels = 0;
  size_t row_bytes = 0;
};

void on_png_error(png_structp png, png_const_charp msg) {
  auto* c = static_cast<PngContext*>(png_get_error_ptr(png));
  std::snprintf(c->message, sizeof(c->message), "%s", msg);
  png_longjmp(png, 1);
}
void on_png_warning(png_structp, png_const_charp) {}

void on_png_read(png_structp png, png_bytep out, size_t n) {
  auto* c = static_cast<PngContext*>(png_get_io_ptr(png));
  if (c->size - c->pos < n) png_error(png, "truncated data");
  std::memcpy(out, c->data + c->pos, n);
  c->pos += n;
}

// Reads the header and sets the transforms: palette -> RGB(A), grey below 8 bits -> 8 bits, interlace.
bool read_header(PngContext* c, uint32_t max_side) {
  if (setjmp(png_jmpbuf(c->png))) return false;
  png_set_user_limits(c->png, max_side, max_side);
  // Ancillary chunks (text, iCCP, sPLT) can be zlib bombs or pile up: cap their count and inflated size.
  png_set_chunk_cache_max(c->png, 128);
  png_set_chunk_malloc_max(c->png, 8 << 20);
  png_set_read_fn(c->png, c, on_png_read);
  png_read_info(c->png, c->info);
  const int color_type = png_get_color_type(c->png, c->info);
  if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(c->png);
  if (color_type == PNG_COLOR_TYPE_GRAY && png_get_bit_depth(c->png, c->info) < 8)
    png_set_expand_gray_1_2_4_to_8(c->png);
  png_set_interlace_handling(c->png);
  png_read_update_info(c->png, c->info);
  c->width = png_get_image_width(c->png, c->info);
  c->height = png_get_image_height(c->png, c->info);
  c->bit_depth = png_get_bit_depth(c->png, c->info);
  c->channels = png_get_channels(c->png, c->info);
  c->row_bytes = png_get_rowbytes(c->png, c->info);
  return true;
}

bool read_rows(PngContext* c, png_bytepp rows) {
  if (setjmp(png_jmpbuf(c->png))) return false;
  png_read_image(c->png, rows);
  return true;
}

// One decoded row (bit_depth 8 or 16, big-endian, 1-4 channels) to RGB as Pillow converts it.
void row_to_rgb(const uint8_t* in, int64_t width, int channels, int bit_depth, uint8_t* out) {
  const int bps = bit_depth / 8;
  const int stride = channels * bps;
  for (int64_t x = 0; x < width; ++x, in += stride, out += 3) {
    if (channels <= 2) {
      uint8_t v = in[0];
      // 16-bit grey is Pillow's I;16 mode; its RGB conversion clips the value to 255 (Convert.c I16_RGB).
      if (bps == 2 && channels == 1) v = in[0] != 0 ? 255 : in[1];
      out[0] = out[1] = out[2] = v;
    } else {
      out[0] = in[0];
      out[1] = in[bps];
      out[2] = in[2 * bps];
    }
  }
}

}  // namespace

core::Expected<Image> decode_png(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  PngContext c;
  c.data = bytes.data();
  c.size = bytes.size();
  c.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &c, on_png_error, on_png_warning);
  if (!c.png) return core::Error{"PNG: out of memory"};
  c.info = png_create_info_struct(c.png);
  struct Cleanup {
    PngContext& c;
    ~Cleanup() { png_destroy_read_struct(&c.png, c.info ? &c.info : nullptr, nullptr); }
  } cleanup{c};
  if (!c.info) return core::Error{"PNG: out of memory"};
  const auto side = static_cast<uint32_t>(std::min<int64_t>(limits.max_side, 0x7fffffff));
  if (!read_header(&c, side)) return core::Error{std::string("invalid PNG: ") + c.message};
  DF_TRY(check_image_size("PNG", c.width, c.height, limits));
  if ((c.bit_depth != 8 && c.bit_depth != 16) || c.channels < 1 || c.channels > 4 ||
      c.row_bytes < static_cast<size_t>(c.width) * c.channels * (c.bit_depth / 8))
    return core::Error{"PNG: unsupported pixel layout (" + std::to_string(c.channels) + " channels of " +
                       std::to_string(c.bit_depth) + " bits)"};
  std::vector<uint8_t> raw(c.row_bytes * c.height);
  std::vector<png_bytep> rows(c.height);
  for (png_uint_32 y = 0; y < c.height; ++y) rows[y] = raw.data() + y * c.row_bytes;
  if (!read_rows(&c, rows.data())) return core::Error{std::string("invalid PNG: ") + c.message};
  Image img;
  img.width = c.width;
  img.height = c.height;
  img.rgb.resize(static_cast<size_t>(img.width * img.height * 3));
  for (png_uint_32 y = 0; y < c.height; ++y)
    row_to_rgb(rows[y], img.width, c.channels, c.bit_depth, img.rgb.data() + y * img.width * 3);
  return img;
}

}  // namespace deltaflow::vision
