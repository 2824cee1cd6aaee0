"""Flax NNX ports of Qwen-family decoders (issue 3)."""
