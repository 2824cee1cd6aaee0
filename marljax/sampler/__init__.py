"""Prefill + decode generation with a KV cache (issue 4)."""
