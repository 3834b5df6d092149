"""Decision 3.0 media intake: sizes, token counts, frame indices and timestamps from the spec's rules;
every limit and bad input becomes a 400 or 413 error before heavy work."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest

from vllm_sr_runtime.synthetic.media import data_url, mp4_bytes, png_bytes, solid
from vllm_sr_runtime.errors import InvalidRequest, RequestTooLarge
from vllm_sr_runtime.families.decision3.media import (
    MediaLimits,
    decode_image,
    decode_media,
    decode_video,
    has_placeholder,
    pair_timestamps,
    sample_indices,
    smart_resize,
    visual_tokens,
)


def png(width: int, height: int, color=(200, 30, 60)) -> bytes:
    return png_bytes(solid(width, height, color))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height but carries almost no data (a decompression bomb's header)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + chunk(b"IEND", b"")


def mp4(frames: int, fps: int = 10, size: int = 64) -> bytes:
    return mp4_bytes(frames, fps, size, size, lambda index: solid(size, size, ((index * 8) % 256,) * 3))


@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [
        # 34 x 60 multiples of 32 = 2,088,960 px > 1,638,400: scaled by sqrt(1080*1920/1638400) = 1.125, floored.
        (1080, 1920, (960, 1696)),
        # 96 x 96 < 65,536 px: scaled up by sqrt(65536/10000) = 2.56, ceiled to 256 x 256.
        (100, 100, (256, 256)),
        # Already within bounds: rounded to the nearest multiple of 32 (300 -> 288, 500 -> 512).
        (300, 500, (288, 512)),
    ],
)
def test_smart_resize_follows_qwen2_vl(height, width, expected):
    limits = MediaLimits()
    assert smart_resize(height, width, limits.image_min_pixels, limits.image_max_pixels) == expected


def test_visual_tokens_one_per_32px_square():
    assert visual_tokens(960, 1696) == 30 * 53 == 1590
    assert visual_tokens(256, 256) == 64
    assert visual_tokens(1280, 1280) == 1600  # the image maximum


def test_aspect_ratio_limit():
    with pytest.raises(InvalidRequest, match="aspect ratio"):
        smart_resize(10, 2010, 65_536, 1_638_400)


def test_an_image_of_a_refused_shape_is_named_and_never_decoded(monkeypatch):
    """The aspect ratio is read from the header: the error names which image and its size, and the pixels are
    never decoded (a 20000x60 PNG would be decoded for nothing)."""
    from PIL import Image

    decoded = []
    monkeypatch.setattr(Image.Image, "convert", lambda self, *a, **k: decoded.append(self.size))
    with pytest.raises(InvalidRequest, match=r"images\[1\] of 20000x60 px has an aspect ratio of 333, above 200"):
        decode_image(data_url("image/png", png(20000, 60)), what="images[1]")
    assert decoded == []


@pytest.mark.parametrize(
    ("total", "fps", "expected"),
    [
        (30, 10.0, [0, 6, 12, 17, 23, 29]),  # int(30 / 10 x 2) = 6 frames over linspace(0, 29)
        (10, 30.0, [0, 3, 6, 9]),  # int(0.67) = 0 -> clamped up to 4
        (3, 30.0, [0, 1, 2, 2]),  # at most `total` frames; an odd count repeats the last
        (9000, 30.0, [int(round(x)) for x in np.linspace(0, 8999, 32)]),  # 600 -> clamped down to 32
    ],
)
def test_frame_sampling(total, fps, expected):
    assert sample_indices(total, fps, MediaLimits()) == expected


def test_pair_timestamps_are_means_of_each_pair():
    assert pair_timestamps([0, 6, 12, 17, 23, 29], 10.0) == pytest.approx([0.3, 1.45, 2.6])


def test_image_decodes_and_resizes():
    image = decode_image(data_url("image/png", png(300, 200)))
    assert (image.height, image.width) == smart_resize(200, 300, 65_536, 1_638_400)
    assert image.pixels.shape == (image.height, image.width, 3) and image.pixels.dtype == np.uint8
    assert tuple(image.pixels[5, 5]) == (200, 30, 60)
    assert image.tokens == visual_tokens(image.height, image.width)


@pytest.mark.parametrize(
    ("url", "error", "message"),
    [
        (data_url("image/png", png(64, 64)[:60]), InvalidRequest, "not a valid image/png"),  # truncated
        (data_url("image/jpeg", png(64, 64)), InvalidRequest, "not a valid image/jpeg"),  # PNG sent as JPEG
        (data_url("image/gif", b"GIF89a"), InvalidRequest, "not accepted"),
        (data_url("image/png", png_header_only(20_000, 20_000)), RequestTooLarge, "decompression bomb"),
        (data_url("image/png", png_header_only(5_000, 4_000)), RequestTooLarge, "5000x4000 px, over 16000000"),
        ("https://example.com/cat.png", InvalidRequest, "disabled"),
        ("data:image/png;base64,%%%", InvalidRequest, "invalid base64"),
        ("data:image/png,rawbytes", InvalidRequest, "not a base64 data URL"),
        (42, InvalidRequest, "data URL string"),
    ],
)
def test_bad_images_are_refused(url, error, message):
    with pytest.raises(error, match=message):
        decode_image(url)


def test_image_byte_limit_is_checked_before_decoding():
    limits = MediaLimits(image_bytes=1000)
    with pytest.raises(RequestTooLarge, match="over 1000 bytes"):
        decode_image(data_url("image/png", b"\x00" * 5000), limits)


def test_video_frames_indices_and_timestamps():
    video = decode_video(data_url("video/mp4", mp4(30, fps=10)))
    assert video.fps == pytest.approx(10.0)
    assert video.indices == [0, 6, 12, 17, 23, 29]
    assert video.timestamps == pytest.approx([0.3, 1.45, 2.6])
    assert video.frames.shape == (6, 64, 64, 3)
    assert abs(int(video.frames[1, 10, 10, 0]) - 48) <= 6  # frame 6 was filled with 6 x 8 (lossy codec)
    assert video.tokens == 3 * visual_tokens(64, 64)


def test_bad_videos_are_refused():
    with pytest.raises(InvalidRequest, match="no video stream|no frames"):
        decode_video(data_url("video/mp4", mp4(0)))  # a container with 0 frames
    with pytest.raises(InvalidRequest, match="not a decodable video"):
        decode_video(data_url("video/mp4", mp4(20)[:300]))
    with pytest.raises(InvalidRequest, match="not accepted"):
        decode_video(data_url("video/avi", b"RIFF"))
    with pytest.raises(RequestTooLarge, match="long"):
        decode_video(data_url("video/mp4", mp4(40, fps=10)), MediaLimits(video_seconds=2.0))
    with pytest.raises(RequestTooLarge, match="visual tokens"):
        decode_media(None, [data_url("video/mp4", mp4(30, fps=10))] * 2, MediaLimits(video_tokens=20))


def test_placeholders_in_text_are_detected():
    assert has_placeholder("see <|image_pad|> here") and has_placeholder("<|vision_start|>")
    assert not has_placeholder("an <image> tag is plain text")


class MediaHost:
    """A loopback HTTP server with a few media responses (a real peer for the URL fetcher)."""

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        routes = {
            "/cat.png": (200, {"Content-Type": "image/png"}, png(300, 200)),
            "/cat.txt": (200, {"Content-Type": "text/plain"}, b"meow"),
            "/moved.png": (302, {"Location": "/cat.png"}, b""),
            "/missing.png": (404, {"Content-Type": "text/plain"}, b"no"),
        }

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                status, headers, body = routes.get(self.path, (404, {}, b""))
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture(scope="module")
def media_host():
    host = MediaHost()
    yield host
    host.server.shutdown()


def test_url_fetch_follows_the_allow_list(media_host):
    from vllm_sr_runtime.families.decision3.media_urls import UrlPolicy

    url = f"{media_host.base}/cat.png"
    with pytest.raises(InvalidRequest, match="disabled"):
        decode_image(url)  # off by default
    with pytest.raises(InvalidRequest, match="not on this server's media URL allow-list"):
        decode_image(url, urls=UrlPolicy(("media.example.com",)))
    with pytest.raises(InvalidRequest, match="loopback or private address"):
        decode_image(url, urls=UrlPolicy(("127.0.0.1",)))  # allowed host, but a private address (SSRF guard)
    allowed = UrlPolicy(("127.0.0.1",), allow_private=True, timeout_s=5)
    image = decode_image(url, urls=allowed)
    assert (image.height, image.width) == smart_resize(200, 300, 65_536, 1_638_400)
    with pytest.raises(RequestTooLarge, match="over 100$"):
        decode_image(url, MediaLimits(image_bytes=100), urls=allowed)  # the body is never read past the cap
    with pytest.raises(InvalidRequest, match="text/plain"):
        decode_image(f"{media_host.base}/cat.txt", urls=allowed)
    with pytest.raises(InvalidRequest, match="redirects are not followed"):
        decode_image(f"{media_host.base}/moved.png", urls=allowed)
    with pytest.raises(InvalidRequest, match="HTTP 404"):
        decode_image(f"{media_host.base}/missing.png", urls=allowed)
    assert UrlPolicy(("*.example.com",)).allows_host("cdn.example.com") and not UrlPolicy(("*.example.com",)).allows_host("example.org")
