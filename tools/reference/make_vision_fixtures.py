#!/usr/bin/env python3
"""Small test images for the vision tests (tests/fixtures/vision/images/), written with Pillow from fixed
integer patterns: one per decoder path (PNG 8/16-bit, grey, 1-bit, palette + tRNS, RGBA; JPEG baseline 4:2:0,
grey, CMYK, progressive; WebP lossy, lossless with alpha, animated; GIF interlaced with a transparent first
frame smaller than the screen). Regenerating is only needed to add an image; the committed files are the
inputs of make_vision_goldens.py.

Usage: python3 make_vision_fixtures.py OUT_DIR
"""
import os
import sys

import numpy as np
from PIL import Image


def pattern(h, w, salt=0):
    y, x = np.mgrid[0:h, 0:w]
    r = (x * 255 // max(w - 1, 1) + 17 * salt) % 256
    g = (y * 255 // max(h - 1, 1) + ((x * y + salt) % 37) * 3) % 256
    b = ((x * 13 + y * 7 + salt * 29) ^ (x * y)) % 256
    # high-frequency checker in one corner so that antialiasing matters
    b = np.where((x < w // 3) & (y < h // 3), ((x + y) % 2) * 255, b)
    return np.stack([r, g, b], -1).astype(np.uint8)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rgb = Image.fromarray(pattern(45, 67, 1))
    rgb.save(os.path.join(out, "rgb_67x45.png"))
    a = pattern(30, 40, 2)
    alpha = (np.arange(30 * 40).reshape(30, 40) * 7 % 256).astype(np.uint8)
    Image.fromarray(np.dstack([a, alpha])).save(os.path.join(out, "rgba_40x30.png"))
    g16 = (np.arange(12 * 20).reshape(12, 20) * 97 % 700).astype(np.uint16)
    Image.fromarray(g16).save(os.path.join(out, "gray16_20x12.png"))
    Image.fromarray(pattern(21, 33, 3)[:, :, 1]).save(os.path.join(out, "gray_33x21.png"))
    Image.fromarray((pattern(9, 17, 4)[:, :, 2] > 127).astype(np.uint8) * 255).convert("1").save(
        os.path.join(out, "bw_17x9.png"))
    pal = Image.fromarray(pattern(21, 33, 5)).quantize(colors=16)
    pal.save(os.path.join(out, "palette_trns_33x21.png"), transparency=3)
    photo = Image.fromarray(pattern(50, 80, 6))
    photo.save(os.path.join(out, "photo_80x50.jpg"), quality=85)
    Image.fromarray(pattern(17, 31, 7)[:, :, 0]).save(os.path.join(out, "gray_31x17.jpg"), quality=90)
    Image.fromarray(pattern(16, 24, 8)).convert("CMYK").save(os.path.join(out, "cmyk_24x16.jpg"), quality=90)
    Image.fromarray(pattern(40, 48, 9)).save(os.path.join(out, "progressive_48x40.jpg"), quality=80,
                                              progressive=True)
    Image.fromarray(pattern(34, 50, 10)).save(os.path.join(out, "lossy_50x34.webp"), quality=80)
    wa = np.dstack([pattern(20, 30, 11), (np.arange(600).reshape(20, 30) % 251).astype(np.uint8)])
    Image.fromarray(wa).save(os.path.join(out, "lossless_alpha_30x20.webp"), lossless=True)
    Image.fromarray(wa).save(os.path.join(out, "lossy_alpha_30x20.webp"), quality=70)
    f0 = Image.fromarray(pattern(24, 36, 12))
    f1 = Image.fromarray(pattern(24, 36, 13))
    f0.save(os.path.join(out, "anim_36x24.webp"), save_all=True, append_images=[f1], duration=100, lossless=True)
    # GIF: 40x30 screen, first frame 24x20 at (5, 4), transparent index 2, interlaced.
    screen = Image.new("P", (40, 30), 0)
    screen.putpalette([(i * 37) % 256 for i in range(768)])
    frame = Image.fromarray((pattern(20, 24, 14)[:, :, 0] // 16).astype(np.uint8)).convert("P")
    frame.putpalette([(i * 37) % 256 for i in range(768)])
    frame.save(os.path.join(out, "_tmp.gif"), interlace=True)
    raw = open(os.path.join(out, "_tmp.gif"), "rb").read()
    os.remove(os.path.join(out, "_tmp.gif"))
    open(os.path.join(out, "frame_gif_40x30.gif"), "wb").write(build_gif(raw, 40, 30, 5, 4, transparent=2))
    for f in sorted(os.listdir(out)):
        print(f, os.path.getsize(os.path.join(out, f)))


def build_gif(raw, sw, sh, left, top, transparent):
    """Rewrites a single-frame GIF from Pillow: a larger logical screen, the frame at (left, top), and a
    graphic control extension with a transparent index (Pillow cannot write that layout directly)."""
    import struct
    assert raw[:6] in (b"GIF87a", b"GIF89a")
    flags = raw[10]
    gct = 3 * (2 << (flags & 7)) if flags & 0x80 else 0
    head = b"GIF89a" + struct.pack("<HH", sw, sh) + raw[10:13] + raw[13:13 + gct]
    i = 13 + gct
    body = raw[i:]
    # skip extensions Pillow wrote
    while body[0] == 0x21:
        j = 2
        while body[j] != 0:
            j += body[j] + 1
        body = body[j + 1:]
    assert body[0] == 0x2C
    desc = bytearray(body[:10])
    desc[1:5] = struct.pack("<HH", left, top)
    gce = bytes([0x21, 0xF9, 4, 1, 10, 0, transparent, 0])
    return head + gce + bytes(desc) + body[10:]


if __name__ == "__main__":
    main()
