"""Functions registered by name with a decorator, so that an option can name one.

`@POLICY_RATIOS.register("gspo")` on a function makes `loss_type="gspo"` pick
it (as tunix's `function_registry`): a new variant is one decorated function,
and the code that dispatches on the name does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from marljax.kernels import _checks

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """Named functions of one kind; `option` is the argument whose value names one (for errors)."""

    def __init__(self, option: str):
        self.option = option
        self._functions: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding the function under `name`; a name can be registered once."""

        def add(fn: F) -> F:
            if name in self._functions:
                taken = self._functions[name].__qualname__
                raise ValueError(f"{self.option} {name!r} is already registered to {taken}")
            self._functions[name] = fn
            return fn

        return add

    def get(self, name: str) -> F:
        """The function registered as `name`; an unknown name is a ValueError naming `option`."""
        return self._functions[_checks.choice(name, self.option, self._functions)]

    def names(self) -> tuple[str, ...]:
        """Registered names, in registration order."""
        return tuple(self._functions)
