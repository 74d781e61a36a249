#!/usr/bin/env python3
"""Goldens for the vision tests, from transformers 5.17 + torchvision + Pillow on the CPU (fp32).

Inputs: the `deltaflow make-tiny --preset vl --seed 1` checkpoint and tests/fixtures/vision/images/.
Writes tests/fixtures/vision/goldens.safetensors with:

  decoded/<file>        U8  [H, W, 3]  Pillow: Image.open(f).convert("RGB")
  resized/<case>        U8  [h, w, 3]  the image after the processor's resize (torchvision, uint8, CPU)
  pixels/<case>         F32 [rows, 1536] Qwen2VLImageProcessor pixel_values (the small cases only)
  grid/<case>           I64 [3]        image_grid_thw
  smart_resize          I64 [n, 7]     rows (h, w, factor, min_pixels, max_pixels, out_h, out_w)
  encoder/<name>/input_cases  the cases fed to the encoder (I64 indices into CASES)
  encoder/<name>/embeddings   F32 [patches, D]  patch embedding + positions (hook on blocks[0] input)
  encoder/<name>/merged       F32 [tokens, out_hidden]  Qwen3_5VisionModel pooler_output
  mrope/<name>/ids      I32 [n]        prompt ids (text, vision_start, image_pad * k, vision_end, ...)
  mrope/<name>/positions I64 [3, n]    Qwen3_5Model.get_rope_index
  mrope/<name>/delta    I64 [1]
And LOGITS_FILE (tests/fixtures/vision/logits.safetensors), for the engine once images reach the model:
  logits/<name>         F32 [n, V]     Qwen3_5ForConditionalGeneration logits for the mrope prompts with images

Cases are named after their source: a fixture file, or a synthetic pattern (synth_HxW: the integer formula
in synthetic_image(), which the C++ test recomputes).

Usage: python3 make_vision_goldens.py --model DIR --images DIR --out FILE --logits-out LOGITS_FILE
"""
import argparse
import json
import os
import sys

import numpy as np
import torch
from PIL import Image
from safetensors.torch import save_file


def synthetic_image(h, w):
    # Integer pattern, recomputed by tests/unit/vision_preprocess_test.cpp.
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    r = (x * 7 + y * 3) % 256
    g = (x * y + 5 * x) % 256
    b = np.where(((x // 3) + (y // 3)) % 2 == 0, 250, 10)
    return np.stack([r, g, b], -1).astype(np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--logits-out", required=True)
    a = ap.parse_args()
    import transformers
    import torchvision
    from torchvision.transforms.v2 import functional as tvF
    from transformers import Qwen2VLImageProcessor, Qwen3_5ForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import smart_resize

    out, logits_out = {}, {}
    files = sorted(f for f in os.listdir(a.images) if not f.startswith("."))
    images = {}
    for f in files:
        im = Image.open(os.path.join(a.images, f)).convert("RGB")
        arr = np.asarray(im).copy()
        out[f"decoded/{f}"] = torch.from_numpy(arr)
        images[f] = im

    proc = Qwen2VLImageProcessor.from_pretrained(a.model)
    cases = {f: images[f] for f in ("rgb_67x45.png", "photo_80x50.jpg", "lossy_50x34.webp", "gray_31x17.jpg")}
    for h, w in ((300, 400), (100, 150), (37, 1000), (64, 64)):
        cases[f"synth_{h}x{w}"] = Image.fromarray(synthetic_image(h, w))
    small = {"rgb_67x45.png", "synth_64x64"}  # the others are the resized bytes through the same affine map
    grids = {}
    pixel_values = {}
    for name, im in cases.items():
        res = proc(images=[im], return_tensors="pt")
        pv, grid = res["pixel_values"], res["image_grid_thw"][0]
        # The resize alone, as the processor does it (uint8 CHW tensor through tvF.resize); check that rescale,
        # normalise and patchify of it give the processor's pixel values exactly.
        t = tvF.pil_to_tensor(im)
        rh, rw = smart_resize(t.shape[1], t.shape[2], factor=proc.patch_size * proc.merge_size,
                              min_pixels=proc.size["shortest_edge"], max_pixels=proc.size["longest_edge"])
        r = tvF.resize(t, [rh, rw], interpolation=tvF.InterpolationMode.BICUBIC, antialias=True)
        norm = (r.float() - 127.5) / 127.5
        P, M = proc.patch_size, proc.merge_size
        gh, gw = rh // P, rw // P
        p = norm.reshape(3, gh // M, M, P, gw // M, M, P).permute(1, 4, 2, 5, 0, 3, 6)
        p = p.unsqueeze(5).expand(-1, -1, -1, -1, -1, 2, -1, -1).reshape(gh * gw, -1)
        assert torch.equal(p, pv), name
        out[f"resized/{name}"] = r.permute(1, 2, 0).contiguous()
        out[f"grid/{name}"] = grid.to(torch.int64)
        if name in small:
            out[f"pixels/{name}"] = pv.float().contiguous()
        grids[name] = grid
        pixel_values[name] = pv

    rows = []
    for (h, w) in ((45, 67), (50, 80), (48, 80), (80, 48), (16, 16), (1, 150), (2000, 3000), (4096, 4096),
                   (10000, 60), (33, 33), (224, 224), (720, 1280), (1080, 1920), (5000, 4999), (31, 17)):
        for (mn, mx) in ((4096, 65536), (65536, 16777216), (3136, 1003520)):
            for factor in (32, 28):
                oh, ow = smart_resize(h, w, factor=factor, min_pixels=mn, max_pixels=mx)
                rows.append([h, w, factor, mn, mx, oh, ow])
    out["smart_resize"] = torch.tensor(rows, dtype=torch.int64)

    model, info = Qwen3_5ForConditionalGeneration.from_pretrained(a.model, dtype=torch.float32,
                                                                  output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "mismatched_keys", "error_msgs",
                                                         "unexpected_keys")}
    if bad:
        raise SystemExit(f"loading problems {bad}")
    model.eval()
    visual = model.model.visual
    cfg = model.config
    enc_sets = {"one": ["rgb_67x45.png"], "two": ["rgb_67x45.png", "photo_80x50.jpg"],
                "three": ["synth_64x64", "gray_31x17.jpg", "synth_100x150"]}
    names = list(cases)
    with torch.no_grad():
        # A two-frame grid (video-like: attention stays within each frame) with formula pixel values:
        # row i, column j = ((37 i + 11 j) % 255) / 127.5 - 1, recomputed by the C++ test.
        vg = torch.tensor([[2, 4, 6]])
        n = int(vg.prod())
        ii, jj = torch.meshgrid(torch.arange(n), torch.arange(1536), indexing="ij")
        vpx = ((ii * 37 + jj * 11) % 255).float() / 127.5 - 1
        captured = []
        hook = visual.blocks[0].register_forward_pre_hook(lambda m, args: captured.append(args[0].clone()))
        res = visual(vpx, grid_thw=vg, return_dict=True)
        hook.remove()
        out["encoder/frames/grid"] = vg[0].to(torch.int64)
        out["encoder/frames/embeddings"] = captured[0].float().contiguous()
        out["encoder/frames/merged"] = res.pooler_output.float().contiguous()
        for ename, members in enc_sets.items():
            pv = torch.cat([pixel_values[m] for m in members])
            g = torch.stack([grids[m] for m in members])
            captured = []
            hook = visual.blocks[0].register_forward_pre_hook(lambda m, args: captured.append(args[0].clone()))
            res = visual(pv, grid_thw=g, return_dict=True)
            hook.remove()
            out[f"encoder/{ename}/input_cases"] = torch.tensor([names.index(m) for m in members], dtype=torch.int64)
            out[f"encoder/{ename}/embeddings"] = captured[0].float().contiguous()
            out[f"encoder/{ename}/merged"] = res.pooler_output.float().contiguous()

        vs, ve, ip = cfg.vision_start_token_id, cfg.vision_end_token_id, cfg.image_token_id
        merge = cfg.vision_config.spatial_merge_size

        def img_tokens(m):
            return [vs] + [ip] * int(grids[m].prod() // merge**2) + [ve]

        prompts = {
            "text": ([5, 17, 300, 42, 7], []),
            "one": ([999, 12, 13] + img_tokens("rgb_67x45.png") + [40, 41, 42, 1000], ["rgb_67x45.png"]),
            "two": ([999, 12] + img_tokens("photo_80x50.jpg") + [50, 51] + img_tokens("synth_100x150") + [60, 1000],
                    ["photo_80x50.jpg", "synth_100x150"]),
        }
        for pname, (ids, members) in prompts.items():
            t = torch.tensor([ids])
            mm = (t == ip).int()
            g = torch.stack([grids[m] for m in members]) if members else None
            pos, delta = model.model.get_rope_index(t, mm, image_grid_thw=g)
            out[f"mrope/{pname}/ids"] = torch.tensor(ids, dtype=torch.int32)
            out[f"mrope/{pname}/positions"] = pos[:, 0].to(torch.int64).contiguous()
            out[f"mrope/{pname}/delta"] = delta.reshape(1).to(torch.int64)
            if members:
                pv = torch.cat([pixel_values[m] for m in members])
                logits = model(input_ids=t, pixel_values=pv, image_grid_thw=g, mm_token_type_ids=mm,
                               use_cache=False).logits[0]
                logits_out[f"logits/{pname}"] = logits.float().contiguous()
                logits_out[f"ids/{pname}"] = torch.tensor(ids, dtype=torch.int32)
                logits_out[f"grids/{pname}"] = g.to(torch.int64).contiguous()

    meta = {"transformers": transformers.__version__, "torch": torch.__version__,
            "torchvision": torchvision.__version__, "pillow": Image.__version__, "device": "cpu",
            "dtype": "float32", "cases": json.dumps(names)}
    save_file({k: v.contiguous() for k, v in out.items()}, a.out, metadata=meta)
    save_file(logits_out, a.logits_out, metadata=meta)
    for f, n in ((a.out, len(out)), (a.logits_out, len(logits_out))):
        print(f"{f}: {n} tensors, {os.path.getsize(f)} bytes")


if __name__ == "__main__":
    sys.exit(main())
