// GIF through giflib, first frame only, as Pillow shows it: the logical screen (grown to the frame if the
// frame reaches past it) filled with the frame's transparent index, or 0, then the frame's indices, looked up
// in the local colour table, else the global one, else read as grey.
#include <gif_lib.h>

#include <cstring>

#include "vision/image_decode.hpp"

namespace deltaflow::vision {
namespace {

struct GifInput {
  const uint8_t* data;
  size_t size, pos;
};

int on_gif_read(GifFileType* gif, GifByteType* out, int n) {
  auto* in = static_cast<GifInput*>(gif->UserData);
  const size_t want = n < 0 ? 0 : static_cast<size_t>(n);
  const size_t k = std::min(want, in->size - in->pos);
  std::memcpy(out, in->data + in->pos, k);
  in->pos += k;
  return static_cast<int>(k);
}

std::string gif_error(const char* what, int code) {
  const char* s = GifErrorString(code);
  return std::string("invalid GIF: ") + what + (s ? std::string(" (") + s + ")" : std::string());
}

}  // namespace

core::Expected<Image> decode_gif(std::span<const uint8_t> bytes, const DecodeLimits& limits) {
  GifInput in{bytes.data(), bytes.size(), 0};
  int err = 0;
  GifFileType* gif = DGifOpen(&in, on_gif_read, &err);
  if (!gif) return core::Error{gif_error("bad header", err)};
  struct Cleanup {
    GifFileType* g;
    ~Cleanup() {
      int e = 0;
      DGifCloseFile(g, &e);
    }
  } cleanup{gif};
  DF_TRY(check_image_size("GIF", gif->SWidth, gif->SHeight, limits));
  int transparent = -1;
  for (;;) {
    GifRecordType rec;
    if (DGifGetRecordType(gif, &rec) == GIF_ERROR)
      return core::Error{gif_error("truncated data", gif->Error)};
    if (rec == TERMINATE_RECORD_TYPE) return core::Error{"invalid GIF: no image in the file"};
    if (rec == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR)
        return core::Error{gif_error("bad extension", gif->Error)};
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1)) transparent = ext[4];
      while (ext) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR)
          return core::Error{gif_error("bad extension", gif->Error)};
      }
      continue;
    }
    if (rec != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) return core::Error{gif_error("bad image descriptor", gif->Error)};
    const GifImageDesc& d = gif->Image;
    const int64_t x0 = d.Left, y0 = d.Top, fw = d.Width, fh = d.Height;
    if (fw <= 0 || fh <= 0) return core::Error{"invalid GIF: the first frame is empty"};
    const int64_t W = std::max<int64_t>(gif->SWidth, x0 + fw), H = std::max<int64_t>(gif->SHeight, y0 + fh);
    DF_TRY(check_image_size("GIF", W, H, limits));
    std::vector<uint8_t> idx(static_cast<size_t>(W * H),
                             static_cast<uint8_t>(transparent >= 0 ? transparent : 0));
    std::vector<GifPixelType> line(static_cast<size_t>(fw));
    auto read_row = [&](int64_t r) -> core::Status {
      if (DGifGetLine(gif, line.data(), static_cast<int>(fw)) == GIF_ERROR)
        return core::Error{gif_error("truncated image data", gif->Error)};
      std::memcpy(idx.data() + (y0 + r) * W + x0, line.data(), static_cast<size_t>(fw));
      return core::Status();
    };
    if (d.Interlace) {
      static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass)
        for (int64_t r = kStart[pass]; r < fh; r += kStep[pass]) DF_TRY(read_row(r));
    } else {
      for (int64_t r = 0; r < fh; ++r) DF_TRY(read_row(r));
    }
    const ColorMapObject* map = d.ColorMap ? d.ColorMap : gif->SColorMap;
    Image img;
    img.width = W;
    img.height = H;
    img.rgb.resize(static_cast<size_t>(W * H * 3));
    for (int64_t i = 0; i < W * H; ++i) {
      uint8_t* o = img.rgb.data() + 3 * i;
      const int v = idx[static_cast<size_t>(i)];
      if (!map) {
        o[0] = o[1] = o[2] = static_cast<uint8_t>(v);
      } else if (v < map->ColorCount) {
        o[0] = map->Colors[v].Red;
        o[1] = map->Colors[v].Green;
        o[2] = map->Colors[v].Blue;
      } else {
        o[0] = o[1] = o[2] = 0;  // past the table: Pillow's palette is zero-filled there
      }
    }
    return img;
  }
}

}  // namespace deltaflow::vision
