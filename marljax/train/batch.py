"""Pack variable-length training rows (`Rows`) into padded, micro-batched arrays for the update step.

Each row is `prompt + completion`, right-padded. Position t of the model
predicts token t + 1, so the loss covers positions `P - 1 .. P + C - 2`
(those that predict a completion token; a row's `completion_mask` takes out
the observation tokens of a multi-turn sequence) and `labels` is the token
sequence shifted left by one. Shapes are bucketed (length to a multiple, rows to a
whole number of micro-batches, or both geometrically) so that the jitted
update recompiles rarely.
"""

from __future__ import annotations

import numpy as np

from marljax.shapes import geometric_bucket, round_up
from marljax.workflows.types import Rows


def collate(
    rows: Rows,
    *,
    micro_batch_size: int,
    pad_id: int = 0,
    length_multiple: int = 32,
    max_len: int | None = None,
    geometric: bool = False,
) -> dict[str, np.ndarray]:
    """Arrays `[M, micro_batch_size, T]` (M micro-batches) for `rows`, in their order.

    Keys: tokens, labels, positions (int32), attention_mask, loss_mask (bool),
    sampling_logp (float32, aligned with loss positions), advantages and
    temperature (the one each row was drawn at) `[M, mb]` (float32). Rows added to fill micro-batches have an empty
    loss mask, so they change neither loss nor gradient. `max_len` truncates
    completions that would not fit (their tail simply gets no loss).
    geometric: round T and M up with `geometric_bucket` (T in units of `length_multiple`)
    instead of to the next multiple: a run whose lengths and sample counts vary (tree
    search, refinement prompts) then compiles a few update shapes, not one per step; the
    update skips micro-batches without loss tokens.
    """
    if not len(rows):
        raise ValueError("collate needs at least one row")
    lengths = [len(p) + len(c) for p, c in zip(rows.prompt_ids, rows.completion_ids)]
    T = (
        geometric_bucket(max(lengths), length_multiple)
        if geometric
        else round_up(max(lengths), length_multiple)
    )
    if max_len is not None:
        T = min(T, max_len)
    M = -(-len(rows) // micro_batch_size)
    B = micro_batch_size * (geometric_bucket(M) if geometric else M)
    tokens = np.full((B, T), pad_id, np.int32)
    attention = np.zeros((B, T), bool)
    loss_mask = np.zeros((B, T), bool)
    sampling = np.zeros((B, T), np.float32)
    advantages = np.zeros((B,), np.float32)
    temperature = np.ones((B,), np.float32)
    advantages[: len(rows)] = rows.advantage
    temperature[: len(rows)] = rows.temperature
    for b, (prompt, completion) in enumerate(zip(rows.prompt_ids, rows.completion_ids)):
        P, mask = len(prompt), rows.completion_mask[b]
        if P == 0 or P >= T:
            raise ValueError(f"row {b}: prompt of {P} tokens does not fit a {T}-token row")
        seq = np.concatenate([prompt, completion])[:T]
        n = len(seq)
        tokens[b, :n] = seq
        attention[b, :n] = True
        loss_mask[b, P - 1 : n - 1] = True if mask is None else mask[: n - P]
        sampling[b, P - 1 : n - 1] = rows.sampling_logprobs[b][: n - P]
    labels = np.concatenate([tokens[:, 1:], np.full((B, 1), pad_id, np.int32)], axis=1)
    positions = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T))
    M = B // micro_batch_size
    batch = dict(
        tokens=tokens,
        labels=labels,
        positions=positions,
        attention_mask=attention,
        loss_mask=loss_mask,
        sampling_logp=sampling,
        advantages=advantages,
        temperature=temperature,
    )
    return {k: v.reshape(M, micro_batch_size, *v.shape[1:]) for k, v in batch.items()}
