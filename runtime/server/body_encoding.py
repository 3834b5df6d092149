"""A request body's Content-Encoding: identity, gzip or deflate, decompressed no further than the body limit
(a small compressed body may not expand past what an uncompressed one may hold)."""

from __future__ import annotations

import zlib

from vllm_sr_runtime.errors import InvalidRequest, RequestTooLarge

# zlib's window bits: gzip's header, and deflate as HTTP means it (a zlib stream; 32 + 15 detects either header)
WINDOW_BITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}


def decoded_body(raw: bytes, encoding: str | None, limit: int) -> bytes:
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return raw
    if encoding not in WINDOW_BITS:
        raise InvalidRequest(f"Content-Encoding {encoding} is not supported (gzip, deflate or identity)")
    stream = zlib.decompressobj(WINDOW_BITS[encoding])
    try:
        body = stream.decompress(raw, limit + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"request body is not valid {encoding}: {exc}") from None
    if len(body) > limit:
        raise RequestTooLarge(f"request body is over the limit of {limit} bytes once decompressed")
    if not stream.eof:
        raise InvalidRequest(f"request body is a truncated {encoding} stream")
    return body
