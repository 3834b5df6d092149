"""An example vllm-sr-runtime plugin: the `keywords` family reads its own package format (keywords.json) and
runs on the `counting` engine. See README.md: it is the guide to writing a family or an engine plugin."""
