"""Decision 3.0 media intake: base64 data URLs -> decoded, size-checked RGB images and sampled video frames.

Every limit is checked before the expensive step it guards: the encoded length before base64 decoding,
the image header's pixel count before decoding pixels (decompression bombs), the container's duration and
frame size before decoding frames. The sizes, token counts, frame indices and timestamps follow the
reference processors (spec: decision-models.md 2.2): Qwen2-VL smart resize to multiples of 32, one token
per 32 x 32 px, 2 fps sampling clamped to 4..32 frames, one temporal group per frame pair.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import threading
from dataclasses import dataclass, field

import numpy as np

from vllm_sr_runtime.cpu_threads import cpu_threads
from vllm_sr_runtime.errors import InvalidRequest, RequestTooLarge
from vllm_sr_runtime.families.decision3.media_urls import UrlPolicy, fetch

IMAGE_MIME = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP"}
VIDEO_MIME = ("video/mp4", "video/webm", "video/quicktime", "video/x-matroska")
PATCH, MERGE, TEMPORAL = 16, 2, 2
FACTOR = PATCH * MERGE  # sides are multiples of 32; one visual token per 32 x 32 px
PLACEHOLDERS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)(?P<params>(;[\w.+-]+=[\w.+-]+)*);base64,", re.ASCII)


@dataclass(frozen=True)
class MediaLimits:
    image_bytes: int = 8_000_000
    image_source_pixels: int = 16_000_000
    image_min_pixels: int = 65_536  # smart-resize area bounds
    image_max_pixels: int = 1_638_400
    max_aspect: float = 200.0
    video_bytes: int = 32_000_000
    video_seconds: float = 300.0
    frame_source_pixels: int = 8_294_400
    frame_max_pixels: int = 200_704  # per-frame budget after resize
    frame_min_pixels: int = 4_096
    min_frames: int = 4
    max_frames: int = 32
    sample_fps: float = 2.0
    fallback_fps: float = 24.0
    video_tokens: int = 16_384  # all videos of one request

    def card(self) -> dict:
        return {
            "image_mime_types": list(IMAGE_MIME), "video_mime_types": list(VIDEO_MIME),
            "image_max_bytes": self.image_bytes, "image_max_source_pixels": self.image_source_pixels,
            "image_max_tokens": self.image_max_pixels // (FACTOR * FACTOR),
            "video_max_bytes": self.video_bytes, "video_max_seconds": self.video_seconds,
            "video_max_frame_pixels": self.frame_source_pixels, "video_frames": [self.min_frames, self.max_frames],
            "video_max_tokens_per_request": self.video_tokens,
        }  # fmt: skip


@dataclass
class DecodedImage:
    pixels: np.ndarray  # [H, W, 3] uint8 RGB, resized to (height, width)
    height: int
    width: int

    @property
    def tokens(self) -> int:
        return visual_tokens(self.height, self.width)


@dataclass
class DecodedVideo:
    frames: np.ndarray  # [T, H, W, 3] uint8 RGB, T even, resized to (height, width)
    height: int
    width: int
    fps: float
    indices: list[int]
    timestamps: list[float] = field(default_factory=list)  # one per frame pair, seconds

    @property
    def tokens(self) -> int:
        return (len(self.indices) // TEMPORAL) * visual_tokens(self.height, self.width)


def visual_tokens(height: int, width: int) -> int:
    return (height // PATCH) * (width // PATCH) // (MERGE * MERGE)


def smart_resize(
    height: int, width: int, min_pixels: int, max_pixels: int, factor: int = FACTOR, max_aspect: float = 200.0, what: str = "image"
) -> tuple[int, int]:
    """Qwen2-VL's smart_resize: sides rounded to multiples of `factor`, area scaled into [min, max]."""
    if min(height, width) < 1:
        raise InvalidRequest(f"{what} of {width}x{height} px has no pixels")
    if max(height, width) / min(height, width) > max_aspect:
        raise InvalidRequest(f"{what} of {width}x{height} px has an aspect ratio of {max(height, width) / min(height, width):.0f}, above {max_aspect:.0f}")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def sample_indices(total: int, fps: float, limits: MediaLimits) -> list[int]:
    """int(total / fps x 2) frames clamped to [4, 32] and to `total`, evenly spaced (rounded linspace);
    an odd count repeats the last frame so frames pair up into temporal groups."""
    if total < 1:
        raise InvalidRequest("the video has no frames")
    count = min(max(int(total / fps * limits.sample_fps), limits.min_frames), limits.max_frames, total)
    indices = [int(round(x)) for x in np.linspace(0, total - 1, count)]
    if len(indices) % TEMPORAL:
        indices.append(indices[-1])
    return indices


def pair_timestamps(indices: list[int], fps: float) -> list[float]:
    """Per temporal group (frame pair): the mean of its first and last frame's time, in seconds."""
    return [(indices[i] / fps + indices[i + TEMPORAL - 1] / fps) / 2 for i in range(0, len(indices), TEMPORAL)]


def decode_data_url(url: object, allowed: tuple[str, ...] | dict, max_bytes: int, what: str, urls: UrlPolicy = UrlPolicy()) -> tuple[str, bytes]:
    """(mime, payload) of a base64 data URL (the encoded length is checked before decoding), or of an
    http(s) URL when `urls` allows its host."""
    if not isinstance(url, str):
        raise InvalidRequest(f"{what} must be a data URL string")
    if url.startswith(("http://", "https://")):
        return fetch(url, urls, tuple(allowed), max_bytes, what)
    match = DATA_URL.match(url)
    if not match:
        raise InvalidRequest(f"{what} is not a base64 data URL (data:<mime>;base64,...)")
    mime = match.group("mime").lower()
    if mime not in allowed:
        raise InvalidRequest(f"{what}: MIME type {mime} is not accepted (one of {', '.join(allowed)})")
    encoded = url[match.end() :]
    if len(encoded) // 4 * 3 > max_bytes + 3:
        raise RequestTooLarge(f"{what} is over {max_bytes} bytes")
    try:
        payload = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"{what}: invalid base64") from None
    if len(payload) > max_bytes:
        raise RequestTooLarge(f"{what} is {len(payload)} bytes, over {max_bytes}")
    if not payload:
        raise InvalidRequest(f"{what} is empty")
    return mime, payload


def decode_image(url: object, limits: MediaLimits = MediaLimits(), what: str = "images[0]", urls: UrlPolicy = UrlPolicy()) -> DecodedImage:
    from PIL import Image

    mime, payload = decode_data_url(url, IMAGE_MIME, limits.image_bytes, what, urls)
    try:
        with Image.open(io.BytesIO(payload), formats=[IMAGE_MIME[mime]]) as image:
            width, height = image.size  # header only: nothing decoded yet
            if width * height > limits.image_source_pixels:
                raise RequestTooLarge(f"{what} is {width}x{height} px, over {limits.image_source_pixels} source pixels")
            # from the header: a size the model refuses is refused before its decode
            new_height, new_width = smart_resize(height, width, limits.image_min_pixels, limits.image_max_pixels, max_aspect=limits.max_aspect, what=what)
            rgb = image.convert("RGB")  # decodes; no EXIF rotation (as the reference)
    except (InvalidRequest, RequestTooLarge):
        raise
    except Image.DecompressionBombError as exc:
        raise RequestTooLarge(f"{what}: refused as a decompression bomb ({exc})") from None
    except Exception as exc:  # PIL raises UnidentifiedImageError, OSError (truncated), SyntaxError, ...
        raise InvalidRequest(f"{what} is not a valid {mime} image ({type(exc).__name__}: {exc})") from None
    return DecodedImage(pixels=_resize(rgb, new_height, new_width), height=new_height, width=new_width)


def decode_video(url: object, limits: MediaLimits = MediaLimits(), what: str = "videos[0]", urls: UrlPolicy = UrlPolicy()) -> DecodedVideo:
    try:
        import av
    except ImportError:
        raise InvalidRequest("videos need PyAV on the server (pip install 'vllm-sr-runtime[media]')") from None
    _, payload = decode_data_url(url, VIDEO_MIME, limits.video_bytes, what, urls)
    try:
        with av.open(io.BytesIO(payload), mode="r") as container:
            if not container.streams.video:
                raise InvalidRequest(f"{what} has no video stream")
            stream = container.streams.video[0]
            width, height = stream.codec_context.width, stream.codec_context.height
            if width * height > limits.frame_source_pixels:
                raise RequestTooLarge(f"{what}: frames of {width}x{height} px are over {limits.frame_source_pixels} pixels")
            new_height, new_width = smart_resize(height, width, limits.frame_min_pixels, limits.frame_max_pixels, max_aspect=limits.max_aspect, what=what)
            fps = float(stream.average_rate or 0) or limits.fallback_fps
            if not 1.0 <= fps <= 240.0:
                fps = limits.fallback_fps  # implausible rate
            duration = _duration(container, stream)
            if duration is not None and duration > limits.video_seconds:
                raise RequestTooLarge(f"{what} is {duration:.0f} s long, over {limits.video_seconds:.0f} s")
            total = stream.frames or _count_packets(container, stream)
        if total / fps > limits.video_seconds:
            raise RequestTooLarge(f"{what} is {total / fps:.0f} s long, over {limits.video_seconds:.0f} s")
        indices = sample_indices(total, fps, limits)
        wanted, picked, last = set(indices), {}, None
        with av.open(io.BytesIO(payload), mode="r") as container:  # decode again, keeping only sampled frames
            for ordinal, frame in enumerate(container.decode(container.streams.video[0])):
                if ordinal in wanted:
                    picked[ordinal] = frame.to_ndarray(format="rgb24")
                last = frame
                if ordinal >= max(wanted):
                    break
        if not picked and last is None:
            raise InvalidRequest(f"{what} has no decodable frames")
        if len(picked) < len(wanted):  # the container promised more frames than it holds
            fallback = picked[max(picked)] if picked else last.to_ndarray(format="rgb24")
            picked.update({index: fallback for index in wanted - set(picked)})
    except (InvalidRequest, RequestTooLarge):
        raise
    except Exception as exc:  # av.error.* for truncated or foreign containers
        raise InvalidRequest(f"{what} is not a decodable video ({type(exc).__name__}: {exc})") from None
    from PIL import Image

    resized = {index: _resize(Image.fromarray(array), new_height, new_width) for index, array in picked.items()}
    return DecodedVideo(
        frames=np.stack([resized[index] for index in indices]), height=new_height, width=new_width, fps=fps,
        indices=indices, timestamps=pair_timestamps(indices, fps),
    )  # fmt: skip


DECODE_SLOTS = threading.BoundedSemaphore(max(2, cpu_threads()))  # requests decoding at once, per process


def decode_media(
    images: object, videos: object, limits: MediaLimits = MediaLimits(), urls: UrlPolicy = UrlPolicy()
) -> tuple[list[DecodedImage], list[DecodedVideo]]:
    """A request's `images` and `videos` lists, every limit enforced (the video token budget over all). Requests
    decode a few at a time: a decode is CPU work, and its source frames (up to the source-pixel limits) are held
    while it runs, so a server whose request threads all decode at once would gain no speed and hold them all."""
    with DECODE_SLOTS:
        decoded_images = [decode_image(url, limits, f"images[{i}]", urls) for i, url in enumerate(_as_list(images, "images"))]
        decoded_videos = []
        tokens = 0
        for i, url in enumerate(_as_list(videos, "videos")):
            video = decode_video(url, limits, f"videos[{i}]", urls)
            tokens += video.tokens
            if tokens > limits.video_tokens:
                raise RequestTooLarge(f"videos need {tokens}+ visual tokens, over {limits.video_tokens} per request")
            decoded_videos.append(video)
    return decoded_images, decoded_videos



def has_placeholder(text: str) -> bool:
    """A literal vision placeholder in state or question text would be expanded as media: refused."""
    return any(token in text for token in PLACEHOLDERS)


def _as_list(value: object, name: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"'{name}' must be a list of data URLs")
    return value


def _count_packets(container, stream) -> int:
    """Frames of a stream whose header does not say (WebM): its packets, demuxed without decoding."""
    return sum(1 for packet in container.demux(stream) if packet.size)


def _duration(container, stream) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / 1_000_000  # av.time_base
    return None


def _resize(image, height: int, width: int) -> np.ndarray:
    from PIL import Image

    if image.size != (width, height):
        image = image.resize((width, height), Image.Resampling.BICUBIC)
    return np.asarray(image, dtype=np.uint8)
