"""Fixtures shared across test packages: tiny random HF checkpoints, built once per session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """`checkpoint(name)` -> path of the tiny checkpoint `marljax.models.testing.CASES[name]` (built on first use)."""
    from marljax.models import testing

    made: dict[str, object] = {}

    def get(name: str, **extra):
        key = name + repr(sorted(extra.items()))
        if key not in made:
            family, overrides = testing.CASES[name]
            made[key] = testing.make_tiny_checkpoint(
                tmp_path_factory.mktemp(name), family, **{**overrides, **extra})
        return made[key]

    return get
