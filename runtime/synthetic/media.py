"""Synthetic images and videos (benchmarks, the parity suite, tests): encoders and the fixed-seed pictures they
draw, in one place. Real decoders read them: nothing here is a shortcut around media handling."""

from __future__ import annotations

import base64
import io
from typing import Callable

import numpy as np


def data_url(mime: str, payload: bytes) -> str:
    return f"data:{mime};base64," + base64.b64encode(payload).decode()


def png_bytes(pixels: np.ndarray) -> bytes:
    """An RGB uint8 array [height, width, 3] as a PNG."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.asarray(pixels, dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def noise(width: int, height: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)


def solid(width: int, height: int, color: tuple[int, int, int]) -> np.ndarray:
    return np.broadcast_to(np.asarray(color, dtype=np.uint8), (height, width, 3)).copy()


def gradient(width: int, height: int, seed: int) -> np.ndarray:
    """A horizontal and vertical ramp with a seeded third channel and noise: a picture with structure."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 255 // max(1, width - 1)), (y * 255 // max(1, height - 1)), np.full_like(x, rng.integers(0, 255))], axis=-1)
    return np.clip(pixels + rng.integers(-20, 20, pixels.shape), 0, 255).astype(np.uint8)


def mp4_bytes(frames: int, fps: int, width: int, height: int, frame: Callable[[int], np.ndarray]) -> bytes:
    """`frames` RGB frames (`frame(index)`) as an MPEG-4 mp4; the header is written even with no frame."""
    import av

    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp4") as container:
        stream = container.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        container.start_encoding()
        for index in range(frames):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.asarray(frame(index), dtype=np.uint8), format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buffer.getvalue()


def noise_video(width: int, height: int, frames: int, fps: int, seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    return mp4_bytes(frames, fps, width, height, lambda _: rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def moving_square_video(seed: int, frames: int = 24, fps: int = 8, size: int = 96) -> bytes:
    """A bright square moving over a fixed noisy background."""
    base = np.random.default_rng(seed).integers(0, 255, (size, size, 3))

    def frame(index: int) -> np.ndarray:
        picture = base.copy()
        left = (index * 3) % (size - 30)
        picture[10:40, left : left + 30] = 255
        return picture

    return mp4_bytes(frames, fps, size, size, frame)
