"""Decision 2.0: Qwen3 / Qwen3.5 backbones (+ LoRA), segmented-options prompt, candidate head."""
