"""Tests for `vitpe_core.images`: a corpus of good, odd and hostile uploads, and a fuzzer.

Every file is generated here with Pillow or by hand (PNG chunks via zlib): no fixtures on
disk. Each case asserts either an RGB image of the expected size and content, or an
`ImageError`.
"""

from __future__ import annotations

import io
import struct
import time
import zlib

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from vitpe_core.images import ImageError, ImageInfo, _to_rgb, load_image, load_image_info, prepare_for_model

RED, GREEN, BLUE, WHITE, BLACK = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)


# ---------------------------------------------------------------- helpers building files


def encode(img: Image.Image, fmt: str, **options) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def noise(width: int = 64, height: int = 48, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def png_chunk(tag: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + tag + payload + struct.pack(">I", zlib.crc32(tag + payload))


def png_bomb(width: int, height: int, rows: int | None = None) -> bytes:
    """A 1-bit all-black PNG written by hand: tiny file, `width * height` pixels when decoded.

    `rows` limits how many rows are actually compressed (the header still claims `height`).
    """
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grayscale
    row = b"\x00" * (1 + (width + 7) // 8)  # filter byte + packed bits
    compressor = zlib.compressobj(9)
    idat = b"".join(compressor.compress(row) for _ in range(height if rows is None else rows))
    idat += compressor.flush()
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def flip_middle(data: bytes, count: int = 16) -> bytes:
    mid = len(data) // 2
    return data[:mid] + bytes(b ^ 0xFF for b in data[mid : mid + count]) + data[mid + count :]


def pixel(img: Image.Image, xy: tuple[int, int]) -> tuple[int, ...]:
    return img.getpixel(xy)


def assert_close(actual: tuple[int, ...], expected: tuple[int, ...], tol: int = 8) -> None:
    assert all(abs(a - e) <= tol for a, e in zip(actual, expected, strict=True)), (actual, expected)


def assert_rgb(img: Image.Image, size: tuple[int, int]) -> None:
    assert isinstance(img, Image.Image)
    assert img.mode == "RGB"
    assert img.size == size
    img.getpixel((0, 0))  # the pixels are really there (not lazily pointing at a closed file)


# ---------------------------------------------------------------- refused inputs

GOOD = {fmt: encode(noise(), fmt) for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF")}


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_valid_files_of_every_allowed_format_decode(fmt: str) -> None:
    img = load_image(GOOD[fmt])
    assert_rgb(img, (64, 48))
    if fmt in ("PNG", "BMP", "TIFF"):  # lossless
        assert np.array_equal(np.asarray(img), np.asarray(noise()))


@pytest.mark.parametrize("fmt", sorted(GOOD))
def test_truncated_files_are_refused(fmt: str) -> None:
    data = GOOD[fmt]
    with pytest.raises(ImageError, match="damaged or truncated"):
        load_image(data[: len(data) // 2])


@pytest.mark.parametrize("fmt", ["PNG", "GIF"])
def test_corrupted_lossless_streams_are_refused(fmt: str) -> None:
    with pytest.raises(ImageError, match="damaged or truncated"):
        load_image(flip_middle(GOOD[fmt]))


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP", "BMP", "TIFF"])
def test_corrupted_pixel_data_without_checksum_decodes_to_garbage_of_the_right_size(fmt: str) -> None:
    # These formats carry no checksum over their pixel data: flipped bytes there cannot be
    # detected, only contained (right size, RGB, no crash).
    assert_rgb(load_image(flip_middle(GOOD[fmt])), (64, 48))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"hello, this is just text\n" * 10, "not an image"),
        (b"<!doctype html><html><body><img src=x.png></body></html>", "not an image"),
        (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "not an image"),
        (b"\x89PNG\r\n\x1a\n", "damaged or truncated|not an image"),  # signature only
        (encode(noise(8, 8), "PPM"), "not an image"),  # a real image, not on the allow-list
        (encode(noise(8, 8), "ICO"), "not an image"),
    ],
    ids=["zero-bytes", "text", "html-renamed-png", "svg", "png-signature-only", "ppm", "ico"],
)
def test_non_images_are_refused_with_a_clear_message(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        load_image(data)


@pytest.mark.parametrize("data", ["not bytes", None, 12, io.BytesIO(GOOD["PNG"])])
def test_non_bytes_input_is_refused(data: object) -> None:
    with pytest.raises(ImageError, match="Expected the file's bytes"):
        load_image(data)  # type: ignore[arg-type]


def test_bytes_like_input_is_accepted() -> None:
    assert_rgb(load_image(bytearray(GOOD["PNG"])), (64, 48))
    assert_rgb(load_image(memoryview(GOOD["PNG"])), (64, 48))


def test_files_over_max_bytes_are_refused_before_decoding() -> None:
    with pytest.raises(ImageError, match="MiB"):
        load_image(GOOD["PNG"], max_bytes=len(GOOD["PNG"]) - 1)
    assert_rgb(load_image(GOOD["PNG"], max_bytes=len(GOOD["PNG"])), (64, 48))


def test_bad_limits_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="positive"):
        load_image(GOOD["PNG"], max_pixels=0)


def test_zero_width_header_is_refused() -> None:
    with pytest.raises(ImageError):
        load_image(png_bomb(0, 10, rows=1))


# ---------------------------------------------------------------- decompression bombs


@pytest.fixture
def decode_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every pixel decode (`ImageFile.load`) made during a test."""
    calls: list[str] = []
    original = ImageFile.ImageFile.load

    def recording_load(self: ImageFile.ImageFile):  # type: ignore[no-untyped-def]
        calls.append(self.format or "?")
        return original(self)

    monkeypatch.setattr(ImageFile.ImageFile, "load", recording_load)
    return calls


def test_bomb_below_pillows_limit_is_refused_fast_from_the_header(decode_calls: list[str]) -> None:
    data = png_bomb(8000, 8000)  # 64 Mpx, above our 40 Mpx default, below Pillow's 89 Mpx
    assert len(data) < 100_000
    start = time.perf_counter()
    with pytest.raises(ImageError, match=r"64,000,000 pixels; the limit is 40,000,000"):
        load_image(data)
    assert time.perf_counter() - start < 2.0  # a guard against hangs, not a benchmark
    assert decode_calls == []


@pytest.mark.parametrize("side", [10_000, 100_000])
def test_bomb_above_pillows_own_limit_is_refused_fast(side: int, decode_calls: list[str]) -> None:
    data = png_bomb(side, side, rows=4)  # only the header matters
    start = time.perf_counter()
    with pytest.raises(ImageError, match="pixels"):
        load_image(data)
    assert time.perf_counter() - start < 2.0
    assert decode_calls == []


@pytest.mark.parametrize("side", [10_000, 100_000])
def test_pillows_own_guard_is_reported_as_our_limit_not_pillows_words(side: int) -> None:
    """Over Pillow's own limit the refusal names the image's pixel count, the app's limit and what
    to do, not Pillow's "could be decompression bomb DOS attack"."""
    with pytest.raises(ImageError) as e:
        load_image(png_bomb(side, side, rows=4))
    text = str(e.value)
    assert f"{side * side:,} pixels" in text and "the limit is 40,000,000 pixels" in text
    assert "Downscale it" in text
    assert "bomb" not in text.lower() and "DOS" not in text


def test_max_pixels_is_respected_and_inclusive() -> None:
    with pytest.raises(ImageError, match="3,072 pixels; the limit is 3,071"):
        load_image(GOOD["PNG"], max_pixels=64 * 48 - 1)
    assert_rgb(load_image(GOOD["PNG"], max_pixels=64 * 48), (64, 48))


# ---------------------------------------------------------------- sizes and aspect ratios


@pytest.mark.parametrize(("size", "ok"), [((1, 1), True), ((1, 100), True), ((100, 1), True),
                                          ((1, 101), False), ((1, 2000), False), ((2000, 1), False)])
def test_aspect_ratio_limit(size: tuple[int, int], ok: bool) -> None:
    data = encode(Image.new("RGB", size, RED), "PNG")
    if ok:
        img = load_image(data)
        assert_rgb(img, size)
        assert pixel(img, (0, 0)) == RED
    else:
        with pytest.raises(ImageError, match="elongated"):
            load_image(data)


# ---------------------------------------------------------------- colour modes


def test_sixteen_bit_png_is_scaled_not_clipped() -> None:
    values = np.array([[0, 257, 32768, 65535]], dtype=np.uint16)
    src = Image.fromarray(values)
    assert src.mode == "I;16"
    img = load_image(encode(src, "PNG"))
    assert_rgb(img, (4, 1))
    assert [pixel(img, (x, 0)) for x in range(4)] == [(0, 0, 0), (1, 1, 1), (128, 128, 128), WHITE]


def test_big_endian_sixteen_bit_is_scaled() -> None:
    values = np.array([[0, 32768, 65535]], dtype=">u2")
    img = _to_rgb(Image.frombytes("I;16B", (3, 1), values.tobytes()))
    assert [pixel(img, (x, 0))[0] for x in range(3)] == [0, 128, 255]


def test_int32_tiff_in_sixteen_bit_range_and_outside_it() -> None:
    in_range = load_image(encode(Image.fromarray(np.array([[0, 65535]], dtype=np.int32)), "TIFF"))
    assert [pixel(in_range, (x, 0))[0] for x in range(2)] == [0, 255]
    signed = load_image(encode(Image.fromarray(np.array([[-5, 0, 5]], dtype=np.int32)), "TIFF"))
    assert [pixel(signed, (x, 0))[0] for x in range(3)] == [0, 128, 255]


def test_float_tiff_is_scaled_from_min_to_max() -> None:
    src = Image.fromarray(np.array([[-1.0, 1.0, 3.0]], dtype=np.float32))
    assert src.mode == "F"
    img = load_image(encode(src, "TIFF"))
    assert_rgb(img, (3, 1))
    assert [pixel(img, (x, 0)) for x in range(3)] == [BLACK, (128, 128, 128), WHITE]


def test_float_with_nan_and_constant_float_do_not_crash() -> None:
    nan = _to_rgb(Image.fromarray(np.array([[np.nan, 0.0, 2.0]], dtype=np.float32)))
    assert [pixel(nan, (x, 0))[0] for x in range(3)] == [0, 0, 255]
    constant = _to_rgb(Image.fromarray(np.full((2, 2), 7.0, dtype=np.float32)))
    assert pixel(constant, (0, 0)) == BLACK


def test_cmyk_jpeg_becomes_rgb() -> None:
    img = load_image(encode(Image.new("CMYK", (32, 16), (0, 255, 255, 0)), "JPEG", quality=95))
    assert_rgb(img, (32, 16))
    assert_close(pixel(img, (16, 8)), RED)


def test_palette_png_with_transparency_is_composited_over_white() -> None:
    src = Image.new("P", (8, 4), 0)
    src.putpalette([0, 0, 0, 255, 0, 0])
    src.paste(1, (4, 0, 8, 4))  # right half: palette index 1 (red); left half: index 0
    img = load_image(encode(src, "PNG", transparency=0))
    assert_rgb(img, (8, 4))
    assert pixel(img, (0, 0)) == WHITE and pixel(img, (7, 3)) == RED


def test_rgba_is_composited_over_white() -> None:
    src = Image.new("RGBA", (3, 1))
    src.putdata([(0, 0, 255, 0), (0, 0, 255, 255), (0, 0, 0, 128)])
    img = load_image(encode(src, "PNG"))
    assert pixel(img, (0, 0)) == WHITE
    assert pixel(img, (1, 0)) == BLUE
    assert_close(pixel(img, (2, 0)), (127, 127, 127), tol=1)


def test_la_is_composited_over_white() -> None:
    src = Image.new("LA", (2, 1))
    src.putdata([(0, 0), (0, 255)])
    img = load_image(encode(src, "PNG"))
    assert [pixel(img, (x, 0)) for x in range(2)] == [WHITE, BLACK]


@pytest.mark.parametrize(("mode", "fmt"), [("L", "PNG"), ("1", "BMP"), ("L", "JPEG"), ("P", "GIF")])
def test_grayscale_and_bilevel_become_rgb(mode: str, fmt: str) -> None:
    src = Image.new("L", (10, 6), 255).convert(mode)
    img = load_image(encode(src, fmt))
    assert_rgb(img, (10, 6))
    assert_close(pixel(img, (5, 3)), WHITE, tol=2)


@pytest.mark.parametrize("mode", ["LAB", "YCbCr", "CMYK"])
def test_other_colour_spaces_from_tiff(mode: str) -> None:
    src = Image.new("RGB", (6, 4), (200, 30, 60)).convert(mode)
    img = load_image(encode(src, "TIFF"))
    assert_rgb(img, (6, 4))
    assert_close(pixel(img, (0, 0)), (200, 30, 60), tol=4)


@pytest.mark.parametrize("mode", ["HSV", "RGBa", "La", "RGBX", "I;16", "I;16B"])
def test_every_in_memory_mode_converts(mode: str) -> None:
    img = _to_rgb(Image.new(mode, (5, 3)))
    assert_rgb(img, (5, 3))


# ---------------------------------------------------------------- animation and orientation


@pytest.mark.parametrize("fmt", ["GIF", "PNG", "WEBP"])
def test_animations_give_their_first_frame(fmt: str) -> None:
    frames = [Image.new("RGB", (12, 8), RED), Image.new("RGB", (12, 8), BLUE)]
    data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    img = load_image(data)
    assert_rgb(img, (12, 8))
    assert_close(pixel(img, (6, 4)), RED, tol=12)


@pytest.mark.parametrize("fmt", ["GIF", "PNG", "WEBP"])
def test_animations_report_their_frame_count(fmt: str) -> None:
    frames = [Image.new("RGB", (12, 8), c) for c in (RED, BLUE, GREEN)]
    data = encode(frames[0], fmt, save_all=True, append_images=frames[1:], duration=100, loop=0)
    img, info = load_image_info(data)
    assert info == ImageInfo(fmt, (12, 8), 3)
    assert info.notes() == [f"This is an animated {fmt} image: only its first frame (of 3) is used."]
    assert_close(pixel(img, (6, 4)), RED, tol=12)


def test_still_images_have_no_notes() -> None:
    img, info = load_image_info(encode(Image.new("RGB", (1, 1), RED), "PNG"))
    assert info == ImageInfo("PNG", (1, 1), 1) and info.notes() == []
    assert load_image_info(GOOD["GIF"])[1].frames == 1


def test_exif_orientation_is_applied() -> None:
    src = Image.new("RGB", (40, 20), RED)
    src.paste(BLUE, (20, 0, 40, 20))  # left half red, right half blue
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 degrees clockwise to display"
    img = load_image(encode(src, "JPEG", exif=exif.tobytes(), quality=95))
    assert_rgb(img, (20, 40))  # transposed
    assert_close(pixel(img, (10, 5)), RED, tol=12)  # the left edge is now at the top
    assert_close(pixel(img, (10, 35)), BLUE, tol=12)


def test_corrupt_exif_does_not_cost_the_picture() -> None:
    img = load_image(encode(Image.new("RGB", (8, 4), GREEN), "JPEG", exif=b"Exif\x00\x00MM\x00*garbage"))
    assert_rgb(img, (8, 4))


# ---------------------------------------------------------------- fuzzing

SEEDS = [encode(noise(12, 8, seed=1), fmt) for fmt in ("PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF")]
SEEDS.append(encode(Image.new("P", (6, 4)), "GIF", save_all=True, append_images=[Image.new("P", (6, 4), 1)]))


@st.composite
def mutated_images(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        kind = draw(st.sampled_from(["flip", "truncate", "insert"]))
        if kind == "flip" and at < len(data):
            data[at] ^= draw(st.integers(1, 255))
        elif kind == "truncate":
            del data[at:]
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
    return bytes(data)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_images(), st.binary(max_size=256)))
def test_fuzz_only_rgb_images_or_image_errors_come_out(data: bytes) -> None:
    try:
        img = load_image(data, max_pixels=2**20)  # small limit keeps huge mutated headers fast
    except ImageError as e:
        assert str(e)
        return
    assert img.mode == "RGB" and img.width >= 1 and img.height >= 1
    assert img.width * img.height <= 2**20


# ---------------------------------------------------------------- prepare_for_model


def test_prepare_for_model_shape_dtype_and_range() -> None:
    x = prepare_for_model(noise(64, 48), (16, 32))  # non-square in, non-square out
    assert x.shape == (3, 16, 32)
    assert x.dtype == torch.float32
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0


def test_prepare_for_model_centre_crops_to_the_target_aspect() -> None:
    src = Image.new("RGB", (120, 30), RED)
    src.paste(GREEN, (20, 0, 100, 30))
    src.paste(BLUE, (100, 0, 120, 30))  # red | green | blue, green well beyond the centre 30x30
    x = prepare_for_model(src, (8, 8))  # a square target keeps only green
    assert torch.allclose(x, torch.tensor([0.0, 1.0, 0.0]).view(3, 1, 1).expand(3, 8, 8), atol=0.02)


def test_prepare_for_model_rejects_empty_size() -> None:
    with pytest.raises(ValueError, match="height, width"):
        prepare_for_model(noise(8, 8), (0, 4))
