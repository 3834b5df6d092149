"""Tokenizer loading: tokenizer.json as-is (Decision 2.0), or as Transformers' Qwen2Tokenizer sees it (Decision 3.0)."""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers

from vllm_sr_runtime.errors import PackageError
from vllm_sr_runtime.packages.files import read_json

QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def load_plain_tokenizer(root: Path) -> Tokenizer:
    path = Path(root) / "tokenizer.json"
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on bad files
        raise PackageError(f"cannot load tokenizer ({exc})", "tokenizer.json") from None


def load_qwen2_tokenizer(root: Path) -> Tokenizer:
    """What Transformers' Qwen2Tokenizer builds from these files: NFC, the Qwen2 split regex then byte-level
    without its own regex, and every token of tokenizer_config's added_tokens_decoder added."""
    tokenizer = load_plain_tokenizer(root)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    config = read_json(root, "tokenizer_config.json")
    decoder = config.get("added_tokens_decoder") or {}
    for token_id in sorted(decoder, key=int):
        entry = decoder[token_id]
        added = AddedToken(
            entry["content"],
            single_word=entry.get("single_word", False),
            lstrip=entry.get("lstrip", False),
            rstrip=entry.get("rstrip", False),
            normalized=entry.get("normalized", not entry.get("special", False)),
            special=entry.get("special", False),
        )
        existing = tokenizer.token_to_id(entry["content"])
        if existing is None:
            (tokenizer.add_special_tokens if added.special else tokenizer.add_tokens)([added])
    return tokenizer


def pad_token_id(root: Path, tokenizer: Tokenizer) -> int:
    config = read_json(root, "tokenizer_config.json")
    for key in ("pad_token", "eos_token"):
        token = config.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if token:
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                return token_id
    raise PackageError("tokenizer has neither a pad_token nor an eos_token", "tokenizer_config.json")
