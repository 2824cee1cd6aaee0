"""Sampler fixtures: the tiny Qwen3 checkpoint loaded once (`checkpoint` is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def qwen3(checkpoint):
    """(model, config, path) of the tiny Qwen3 checkpoint, loaded once."""
    from marljax.models import from_pretrained

    path = checkpoint("qwen3-tied-gqa2")
    model, config = from_pretrained(path)
    return model, config, path
