"""Synthetic images and videos for `bench --media`: a fixed-seed noise PNG and mp4 at realistic sizes."""

from __future__ import annotations

from vllm_sr_runtime.synthetic.media import data_url, noise, noise_video, png_bytes

MEDIA_KINDS = ("none", "image", "video", "image+video")
IMAGE_SIZE = (640, 480)  # width, height: 20 x 15 = 300 visual tokens
VIDEO_SIZE, VIDEO_SECONDS, VIDEO_FPS = (320, 256), 4, 8  # sampled at 2 fps: 8 frames, 4 pairs x 80 tokens


def synthetic_media(kind: str) -> tuple[list[str] | None, list[str] | None]:
    """(images, videos) for one request of the given kind."""
    if kind not in MEDIA_KINDS:
        raise ValueError(f"--media must be one of {', '.join(MEDIA_KINDS)}")
    images = [data_url("image/png", png_bytes(noise(*IMAGE_SIZE)))] if "image" in kind else None
    videos = [data_url("video/mp4", noise_video(*VIDEO_SIZE, VIDEO_SECONDS * VIDEO_FPS, VIDEO_FPS))] if "video" in kind else None
    return images, videos
