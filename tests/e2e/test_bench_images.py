"""`deltaflow bench --images N`: the vision encoder's speed on the CPU backend over a make-tiny vl checkpoint (the
figures are not checked, only that they are there and consistent), and its one-line errors."""
import json

from conftest import run


def test_bench_images_reports_the_encoder(tmp_path):
    vl = str(tmp_path / "vl")
    run("make-tiny", "--preset", "vl", "--seed", 1, "--out", vl)
    out = json.loads(run("bench", "--images", 3, "--image-size", "64x96", "--model", vl, "--device", "cpu",
                         "--json").stdout)
    # 64 x 96 pixels: 4 x 6 patches of 16, merged 2 x 2 into 6 tokens (test_images.py's image).
    assert out["grid_thw"] == [1, 4, 6] and out["tokens_per_image"] == 6
    assert out["images"] == 3 and out["backend"] == "cpu"
    assert out["encode_one_ms"] > 0 and out["encode_batch_s"] > 0
    assert abs(out["images_per_second"] - 3 / out["encode_batch_s"]) < 1e-6 * out["images_per_second"]
    text = run("bench", "--images", 2, "--model", vl, "--device", "cpu").stdout
    assert "1024x1024 -> grid 1x16x16 patches, 64 tokens" in text  # the processor's max_pixels caps the size
    assert "images/s" in text


def test_bench_images_errors_are_one_line(tmp_path):
    p = run("bench", "--images", 2, "--device", "cpu", check=False)  # the default model has no vision tower
    assert p.returncode == 2 and "model.visual.patch_embed.proj.weight" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    for flags, words in ((("--images", 0), "--images"), (("--images", 2, "--image-size", "12"), "--image-size")):
        p = run("bench", *flags, "--device", "cpu", check=False)
        assert p.returncode == 2 and words in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1
