"""Problem sources: where a run's train and eval problems come from, registered by kind.

A source is a frozen settings class with a ``kind`` Literal and a ``split`` method; decorating it
with ``@register_source("<kind>")`` makes ``data.source.kind: <kind>`` in a run config pick it:

    @register_source("riddles")
    class Riddles(GeneratedSource):
        kind: Literal["riddles"] = "riddles"

        def make(self, n, seed, split):
            return [Problem(f"riddle/{seed}/{i}", ...) for i in range(n)]

A registry refuses a kind registered twice and names the option in its errors (the kernels'
`Registry`). A module outside the package registers the same way once it is imported.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Literal

from pydantic import ConfigDict, Field

from marljax.kernels.losses_registry import Registry
from marljax.rewards import Problem
from marljax.settings import StrictModel, check_kind_default

__all__ = ["EVAL_SEED_OFFSET", "SOURCES", "GeneratedSource", "Source", "register_source"]

SPLITS = ("train", "eval")
# A generated eval split draws from `seed + EVAL_SEED_OFFSET`, a seed no train split reaches.
EVAL_SEED_OFFSET = 1_000_000


class Source(StrictModel, abc.ABC):
    """The settings of one kind of source; ``split`` builds that split's problems from them."""

    model_config = ConfigDict(frozen=True)
    kind: str

    @abc.abstractmethod
    def split(self, split: Literal["train", "eval"]) -> list[Problem]:
        """The problems of the ``train`` or ``eval`` split (``[]`` when the source has none)."""


class GeneratedSource(Source):
    """A source that generates problems from a seed: ``n_train`` and ``n_eval`` of them."""

    n_train: int = Field(64, ge=1)
    n_eval: int = Field(32, ge=0)
    seed: int = 0

    def split(self, split: Literal["train", "eval"]) -> list[Problem]:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if split == "train":
            return self.make(self.n_train, self.seed, split)
        return self.make(self.n_eval, self.seed + EVAL_SEED_OFFSET, split)

    @abc.abstractmethod
    def make(self, n: int, seed: int, split: str) -> list[Problem]:
        """``n`` problems, deterministic from ``seed``."""


SOURCES: Registry[type[Source]] = Registry("data source")


def register_source(kind: str) -> Callable[[type[Source]], type[Source]]:
    """Class decorator: make a `Source` subclass the source of ``data.source.kind: <kind>``."""

    def register(cls: type[Source]) -> type[Source]:
        if not (isinstance(cls, type) and issubclass(cls, Source)):
            raise TypeError(f"@register_source({kind!r}) needs a Source subclass, got {cls!r}")
        check_kind_default(cls, kind)
        return SOURCES.register(kind)(cls)

    return register
