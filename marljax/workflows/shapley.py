"""Shapley credit of a team from the values of its coalitions (bitmask-indexed, as in
`marljax.kernels.shapley`): exact, leave-one-out (counterfactual) or sampled over permutations."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from marljax import kernels


def coalition_code(codes: Sequence[str], members: int) -> str:
    """The team program of a worker coalition (bit i of `members`: worker i): members' code in worker
    order, everyone else's masked out."""
    return "\n\n".join(c for i, c in enumerate(codes) if members >> i & 1 and c.strip())


def team_value_table(worker_values: np.ndarray) -> np.ndarray:
    """`[2^W]` worker-coalition values -> `[2^(W+1)]` with the planner as player 0 (bit 0):
    ``v(S) = w(S >> 1)`` when the planner is in S, else ``w(0)`` (no plan: as if no worker wrote code)."""
    idx = np.arange(2 * len(worker_values))
    return np.where(idx & 1, worker_values[idx >> 1], worker_values[0]).astype(np.float32)


def sampled_coalitions(num_players: int, keys: jax.Array, num_permutations: int) -> list[list[int]]:
    """Per key `[N, 2]`: the coalitions `sampled_shapley_values(..., key, num_permutations)` visits
    (bitmask indices), found by running the kernel once with a recording value function."""
    seen: list[set[int]] = [set() for _ in range(len(keys))]

    def record(c):  # c: [N, orders, K + 1, K], the outer vmap first
        idx = (np.asarray(c, np.int64) << np.arange(num_players)).sum(-1)
        for n, rows in enumerate(idx.reshape(len(seen), -1)):
            seen[n].update(rows.tolist())
        return np.zeros(idx.shape, np.float32)

    def probe(c):  # the kernel vmaps it; the callback sees all coalitions at once
        return jax.pure_callback(record, jax.ShapeDtypeStruct((), jnp.float32), c, vmap_method="expand_dims")

    run = jax.vmap(lambda key: kernels.sampled_shapley_values(probe, num_players, key, num_permutations)[0])
    jax.block_until_ready(run(keys))
    return [sorted(s) for s in seen]


def shapley_credit(
    tables: np.ndarray, method: str = "exact", keys: jax.Array | None = None, num_permutations: int = 8
) -> np.ndarray:
    """Shapley value of each player `[N, K]` from bitmask-indexed tables `[N, 2^K]`; `sampled` with one
    PRNG key per table `[N, 2]` (entries its permutations never visit may be NaN)."""
    tables = jnp.asarray(tables, jnp.float32)
    if method == "exact":
        return np.asarray(kernels.shapley_values(tables))
    if method == "counterfactual":
        return np.asarray(kernels.leave_one_out_credit(tables))
    num_players = int(tables.shape[-1]).bit_length() - 1

    def one(table, key):
        return kernels.sampled_shapley_values(
            lambda c: table[kernels.coalition_index(c)], num_players, key, num_permutations
        )[0]

    return np.asarray(jax.vmap(one)(tables, keys))
