"""Synthetic images and videos for `bench --media`: a fixed-seed noise PNG and mp4 at realistic sizes."""

from __future__ import annotations

import base64
import io

import numpy as np

MEDIA_KINDS = ("none", "image", "video", "image+video")
IMAGE_SIZE = (640, 480)  # width, height: 20 x 15 = 300 visual tokens
VIDEO_SIZE, VIDEO_SECONDS, VIDEO_FPS = (320, 256), 4, 8  # sampled at 2 fps: 8 frames, 4 pairs x 80 tokens


def data_url(mime: str, payload: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(payload).decode()


def noise_png(width: int, height: int, seed: int = 0) -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return data_url("image/png", buffer.getvalue())


def noise_mp4(width: int, height: int, seconds: int, fps: int, seed: int = 0) -> str:
    import av

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for _ in range(seconds * fps):
            frame = av.VideoFrame.from_ndarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return data_url("video/mp4", buffer.getvalue())


def synthetic_media(kind: str) -> tuple[list[str] | None, list[str] | None]:
    """(images, videos) for one request of the given kind."""
    if kind not in MEDIA_KINDS:
        raise ValueError(f"--media must be one of {', '.join(MEDIA_KINDS)}")
    images = [noise_png(*IMAGE_SIZE)] if "image" in kind else None
    videos = [noise_mp4(*VIDEO_SIZE, VIDEO_SECONDS, VIDEO_FPS)] if "video" in kind else None
    return images, videos
