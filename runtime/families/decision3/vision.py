"""Decision 3.0 vision inputs: decoded media -> normalized patches, grids, placeholder text, 3-D positions.

Patches follow the Qwen2-VL image / Qwen3-VL video processors: [C, T, 16, 16] patch vectors ordered by
2 x 2 merge blocks, an image duplicated over the temporal patch of 2, every video frame pair one temporal
group. The text around them gets multimodal rotary positions (mrope, as transformers' get_rope_index):
text runs advance all three axes together; a vision run spans (t, h/2, w/2) from the current position,
which then advances by max(h, w)/2.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vllm_sr_runtime.families.decision3.media import MERGE, PATCH, TEMPORAL, DecodedImage, DecodedVideo

TEXT, IMAGE, VIDEO = 0, 1, 2


@dataclass
class VisionInputs:
    """One request's media, preprocessed once and shared by its question rows."""

    prefix_text: str  # the placeholders, expanded, that open the user turn
    pixel_values: np.ndarray | None  # [image patches, C*T*P*P] float32
    image_grid_thw: np.ndarray | None  # [images, 3] int64
    pixel_values_videos: np.ndarray | None
    video_grid_thw: np.ndarray | None
    visual_tokens: int

    @property
    def empty(self) -> bool:
        return self.pixel_values is None and self.pixel_values_videos is None


def normalize(pixels: np.ndarray, mean: list[float], std: list[float]) -> np.ndarray:
    """uint8 [..., H, W, 3] -> float32 [..., 3, H, W]: x / 255 then (x - mean) / std."""
    scaled = pixels.astype(np.float32) / np.float32(255.0)
    normed = (scaled - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.moveaxis(normed, -1, -3).astype(np.float32, copy=False)


def patchify(frames: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[T, C, H, W] (T even) -> ([t*h*w, C*T'*P*P] with T' = 2, (t, h, w)) in the processors' order."""
    count, channels, height, width = frames.shape
    grid_t, grid_h, grid_w = count // TEMPORAL, height // PATCH, width // PATCH
    patches = frames.reshape(grid_t, TEMPORAL, channels, grid_h // MERGE, MERGE, PATCH, grid_w // MERGE, MERGE, PATCH)
    patches = patches.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)  # t, gh, gw, mh, mw, C, T', ph, pw
    return np.ascontiguousarray(patches.reshape(grid_t * grid_h * grid_w, channels * TEMPORAL * PATCH * PATCH)), (grid_t, grid_h, grid_w)


def image_placeholder(image: DecodedImage) -> str:
    return "<|vision_start|>" + "<|image_pad|>" * image.tokens + "<|vision_end|>"


def video_placeholder(video: DecodedVideo) -> str:
    per_pair = video.tokens // len(video.timestamps)
    return "".join(f"<{t:.1f} seconds><|vision_start|>" + "<|video_pad|>" * per_pair + "<|vision_end|>" for t in video.timestamps)


def prepare(images: list[DecodedImage], videos: list[DecodedVideo], mean: list[float], std: list[float]) -> VisionInputs:
    """Images first, then videos, in request order, before the text."""
    image_patches, image_grids, video_patches, video_grids = [], [], [], []
    for image in images:
        frames = np.repeat(normalize(image.pixels, mean, std)[None], TEMPORAL, axis=0)
        patches, grid = patchify(frames)
        image_patches.append(patches)
        image_grids.append(grid)
    for video in videos:
        patches, grid = patchify(normalize(video.frames, mean, std))
        video_patches.append(patches)
        video_grids.append(grid)
    return VisionInputs(
        prefix_text="".join(map(image_placeholder, images)) + "".join(map(video_placeholder, videos)),
        pixel_values=np.concatenate(image_patches) if image_patches else None,
        image_grid_thw=np.asarray(image_grids, dtype=np.int64) if image_grids else None,
        pixel_values_videos=np.concatenate(video_patches) if video_patches else None,
        video_grid_thw=np.asarray(video_grids, dtype=np.int64) if video_grids else None,
        visual_tokens=sum(i.tokens for i in images) + sum(v.tokens for v in videos),
    )


def mrope_positions(token_ids: list[int], image_token: int, video_token: int, image_grids, video_grids) -> np.ndarray:
    """[3, L] positions of one unpadded prompt (transformers' Qwen3_5Model.get_rope_index for one row)."""
    grids = {IMAGE: iter([tuple(g) for g in image_grids] if image_grids is not None else []), VIDEO: iter([])}
    if video_grids is not None:  # every frame pair is its own run between timestamps
        grids[VIDEO] = iter([(1, h, w) for t, h, w in video_grids for _ in range(t)])
    kinds = np.zeros(len(token_ids), dtype=np.int64)
    ids = np.asarray(token_ids)
    kinds[ids == image_token] = IMAGE
    kinds[ids == video_token] = VIDEO
    pieces, current, start = [], 0, 0
    while start < len(kinds):
        end = start
        while end < len(kinds) and kinds[end] == kinds[start]:
            end += 1
        if kinds[start] == TEXT:
            pieces.append(np.broadcast_to(np.arange(current, current + end - start), (3, end - start)))
            current += end - start
        else:
            t, h, w = next(grids[int(kinds[start])])
            lh, lw = h // MERGE, w // MERGE
            tt, hh, ww = np.meshgrid(np.arange(t), np.arange(lh) + current, np.arange(lw) + current, indexing="ij")
            block = np.stack([tt + current, hh, ww]).reshape(3, -1)
            if block.shape[1] != end - start:
                raise ValueError(f"{end - start} placeholder tokens for a {t}x{lh}x{lw} grid")
            pieces.append(block)
            current += max(h, w) // MERGE
        start = end
    return np.concatenate(pieces, axis=1).astype(np.int64) if pieces else np.zeros((3, 0), dtype=np.int64)
