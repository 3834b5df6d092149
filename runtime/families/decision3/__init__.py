"""Decision 3.0: bare Qwen3.5 tower, d3 chat prompt, 255-code readout."""
