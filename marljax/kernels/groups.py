"""Group-relative normalisation: the statistic every GRPO-family estimator shares.

Two layouts give the same numbers:

* ragged: flat ``rewards [N]`` with ``group_ids [N]`` in ``[0, num_groups)``,
  computed with segment sums so shapes stay static under ``jit``;
* dense: ``rewards [..., G]`` with a mask, one group per trailing row
  (``normalize_group`` is the unbatched kernel, ``dense_group_advantages``
  ``vmap``s it over agent x turn).
"""

from __future__ import annotations

import functools

import chex
import jax
import jax.numpy as jnp

from marljax.kernels import _checks

CENTERS = ("mean", "loo", "none")
SCALES = ("std", "none")
SINGLETONS = ("zero", "raw")


def _check_options(center: str, scale: str, eps: float, ddof: int, singleton: str = "zero") -> None:
    _checks.choice(center, "center", CENTERS)
    _checks.choice(scale, "scale", SCALES)
    _checks.choice(singleton, "singleton", SINGLETONS)
    _checks.static_float(eps, "eps", minimum=0.0)
    _checks.static_int(ddof, "ddof", minimum=0)


def _advantages(rewards, valid, group_sum, group_max, center, scale, eps, ddof, singleton="zero"):
    """Advantages from group statistics; shared by both layouts.

    ``group_sum`` / ``group_max`` reduce over each element's own group and
    broadcast the result back to the elements (segment ops for the ragged
    layout, plain reductions for one dense group). Rewards are shifted by a
    member of their group (its max) before any sum, so a constant group gives
    exact zeros instead of rounding noise blown up by the std division.
    """
    count = group_sum(valid.astype(rewards.dtype))
    top = group_max(jnp.where(valid, rewards, -jnp.inf))
    shifted = jnp.where(valid, rewards - jnp.where(count > 0, top, 0.0), 0.0)
    total = group_sum(shifted)
    if center == "mean":
        centred = shifted - total / jnp.maximum(count, 1)
    elif center == "loo":
        # Leave-one-out baseline: mean of the *other* valid members.
        centred = shifted - (total - shifted) / jnp.maximum(count - 1, 1)
    else:
        centred = rewards
    if scale == "std":
        mean = total / jnp.maximum(count, 1)
        sq_dev = group_sum(jnp.where(valid, (shifted - mean) ** 2, 0.0))
        std = jnp.sqrt(sq_dev / jnp.maximum(count - ddof, 1))
        centred = centred / (std + eps)
    identity = center == "none" and scale == "none"
    informative = valid if identity else valid & (count > 1)
    out = jnp.where(informative, centred, 0.0)
    if singleton == "raw":  # verl / DrMAS: a lone sample keeps its reward (mean 0, std 1)
        out = jnp.where(valid & (count == 1), rewards, out)
    return out


def group_advantages(
    rewards: chex.Array,
    group_ids: chex.Array,
    num_groups: int,
    mask: chex.Array | None = None,
    *,
    center: str = "mean",
    scale: str = "std",
    eps: float = 1e-6,
    ddof: int = 1,
    singleton: str = "zero",
) -> jax.Array:
    """Group-relative advantages over ragged groups.

    ``A_i = (r_i - b_i) / (s_g + eps)`` for sample ``i`` in group ``g``, where
    the baseline ``b_i`` is the group mean (``center="mean"``, GRPO: Shao et
    al. 2024, arXiv 2402.03300), the mean of the other members
    (``center="loo"``, RLOO: Ahmadian et al. 2024, arXiv 2402.14740) or 0
    (``"none"``), and ``s_g`` is the group's standard deviation with ``ddof``
    (``scale="std"``) or 1 with ``eps`` dropped (``scale="none"``, Dr.GRPO:
    Liu et al. 2025, arXiv 2503.20783).

    Conventions:
      * masked entries get 0 and enter no statistic (even if they hold NaN);
      * a group with fewer than two valid members carries no comparison and
        gets 0 (``singleton="zero"``; except the identity ``center="none",
        scale="none"``, which returns the masked rewards unchanged);
        ``singleton="raw"`` gives a lone member its reward instead, as verl's
        and DrMAS's GRPO estimators do (mean 0 and std 1 for a group of one);
      * a NaN reward makes its own group's advantages NaN and leaves every
        other group exact; pass ``mask=~jnp.isnan(rewards)`` to drop such
        samples instead;
      * ``group_ids`` outside ``[0, num_groups)``: a ``ValueError`` when the
        ids are concrete; under ``jit`` those samples get NaN and no group is
        affected.

    Args:
      rewards: ``[N]`` float rewards.
      group_ids: ``[N]`` int group of each sample.
      num_groups: static number of groups.
      mask: optional ``[N]`` bool, True for valid samples.
      center, scale, eps, ddof, singleton: static options, see above.

    Returns:
      ``[N]`` advantages, dtype of ``rewards``.
    """
    _checks.rank(rewards, 1, "rewards")
    _checks.floating(rewards, "rewards")
    _checks.integer(group_ids, "group_ids")
    _checks.same_shape(rewards, group_ids, "rewards", "group_ids")
    num_groups = _checks.static_int(num_groups, "num_groups")
    mask = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    _check_options(center, scale, eps, ddof, singleton)
    _checks.ids_in_range(group_ids, num_groups, "group_ids")
    return _ragged(rewards, group_ids, num_groups, mask, center, scale, eps, ddof, singleton)


@functools.partial(jax.jit, static_argnums=(2, 4, 5, 6, 7, 8))
def _ragged(rewards, group_ids, num_groups, mask, center, scale, eps, ddof, singleton):
    in_range = (group_ids >= 0) & (group_ids < num_groups)
    # Out-of-range ids go to an overflow segment that is never read back.
    segment = jnp.where(in_range, group_ids, num_groups)
    valid = mask & in_range

    def per_group(reduce):
        return lambda x: reduce(x, segment, num_segments=num_groups + 1)[segment]

    adv = _advantages(
        rewards,
        valid,
        per_group(jax.ops.segment_sum),
        per_group(jax.ops.segment_max),
        center,
        scale,
        eps,
        ddof,
        singleton,
    )
    return jnp.where(mask & ~in_range, jnp.nan, adv).astype(rewards.dtype)


def normalize_group(
    rewards: chex.Array,
    mask: chex.Array | None = None,
    *,
    center: str = "mean",
    scale: str = "std",
    eps: float = 1e-6,
    ddof: int = 1,
) -> jax.Array:
    """Unbatched kernel: advantages of one group, ``[G] -> [G]``.

    Same formula and conventions as :func:`group_advantages` with every
    sample in one group; ``vmap`` it over any leading axes.
    """
    _checks.rank(rewards, 1, "rewards")
    _checks.floating(rewards, "rewards")
    mask = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    _check_options(center, scale, eps, ddof)
    adv = _advantages(rewards, mask, jnp.sum, jnp.max, center, scale, eps, ddof)
    return adv.astype(rewards.dtype)


def dense_group_advantages(
    rewards: chex.Array,
    mask: chex.Array | None = None,
    *,
    center: str = "mean",
    scale: str = "std",
    eps: float = 1e-6,
    ddof: int = 1,
) -> jax.Array:
    """Dense layout: ``rewards [A, T, G]`` (agents x turns x group), one group per ``[a, t]``.

    ``normalize_group`` ``vmap``ped over agent and turn; equal to
    :func:`group_advantages` with ``group_ids = a * T + t``. Any number of
    leading axes is accepted (e.g. ``[P, A, T, G]`` with problems first).

    Returns:
      advantages with the shape of ``rewards``.
    """
    _checks.floating(rewards, "rewards")
    if jnp.ndim(rewards) < 1:
        raise ValueError("argument `rewards` must have at least one axis (the group axis)")
    mask = _checks.mask_or_ones(mask, rewards, "mask", "rewards")
    kernel = functools.partial(normalize_group, center=center, scale=scale, eps=eps, ddof=ddof)
    for _ in range(jnp.ndim(rewards) - 1):
        kernel = jax.vmap(kernel)
    return kernel(rewards, mask)
