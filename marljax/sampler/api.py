"""Public entry points: `generate` (token ids in, tokens + log-probs out) and `generate_text`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from marljax.models import Decoder, ModelConfig, get_params
from marljax.sampler.engine import REASONS, Buckets, Engine, get_engine, mesh_of, next_bucket
from marljax.sampler.sampling import DEFAULT_BOUND


@dataclasses.dataclass
class SamplerOutput:
    """Completions of `B` prompts x `n` samples, row `r` = sample `r % n` of prompt `r // n`.

    tokens: `[B*n, max_new_tokens]` int32, `pad_id` after each row's end.
    lengths: `[B*n]` int32 generated tokens per row, counting a final EOS token
      or the tokens of a matched stop sequence.
    finish_reason: `[B*n]` str: "eos", "stop" (a stop sequence) or "length".
    logprobs: `[B*n, max_new_tokens]` float32 log-prob of each chosen token under
      `softmax(logits / temperature)` (temperature 1 for greedy rows) without top-k/top-p
      truncation, 0 past `lengths`: what the trainer recomputes for the same tokens
      (`marljax.train.update`), so equal parameters give an importance ratio of exactly 1.
    sampling_logprobs: same shape, under the distribution actually sampled from
      (temperature, top-k, top-p applied; 0 for greedy rows), or None unless
      `return_sampling_logprobs=True`.
    prompt_index: `[B*n]` int32, the prompt each row continues.
    steps: decode-loop iterations run (< max_new_tokens when all rows stopped early).
    """

    tokens: np.ndarray
    lengths: np.ndarray
    finish_reason: np.ndarray
    logprobs: np.ndarray
    sampling_logprobs: np.ndarray | None
    prompt_index: np.ndarray
    steps: int

    def completions(self) -> list[list[int]]:
        """Each row's generated token ids, cut at its length."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths)]


@dataclasses.dataclass
class TextOutput:
    """`texts[r]`: decoded completion of row r (EOS and a matched stop sequence removed);
    `prompts`: the prompt strings as fed to the tokenizer (chat template applied);
    `output`: the underlying `SamplerOutput`."""

    texts: list[str]
    prompts: list[str]
    output: SamplerOutput


def _resolve(model: Any, params: Any) -> tuple[ModelConfig, Any]:
    if isinstance(model, Decoder):
        return model.config, get_params(model) if params is None else params
    if isinstance(model, ModelConfig):
        if params is None:
            raise ValueError("generate(config, ...) needs params=")
        return model, params
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], ModelConfig):
        return _resolve(model[1], get_params(model[0]) if params is None else params)  # (model, config)
    raise TypeError(
        f"model must be a Decoder, a ModelConfig (with params=) or (Decoder, "
        f"ModelConfig), got {type(model).__name__}"
    )


def _eos_ids(eos_ids, config: ModelConfig) -> list[int]:
    if eos_ids is None:
        eos_ids = config.eos_token_id
    if eos_ids is None:
        return []
    if isinstance(eos_ids, (int, np.integer)):
        return [int(eos_ids)]
    return [int(e) for e in eos_ids]


def _as_prompts(prompt_ids) -> list[list[int]]:
    if isinstance(prompt_ids, (np.ndarray, jax.Array)):
        arr = np.asarray(prompt_ids)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2:
            raise ValueError(f"prompt_ids array must be [B, L], got shape {arr.shape}")
        return [list(map(int, r)) for r in arr]
    prompts = [list(map(int, p)) for p in prompt_ids]
    return prompts


def generate(
    model: Any,
    prompt_ids: Any,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: Sequence[Sequence[int]] | None = None,
    eos_ids: int | Sequence[int] | None = None,
    n: int = 1,
    seed: int = 0,
    params: Any = None,
    return_sampling_logprobs: bool = False,
    pad_id: int | None = None,
    mesh: Mesh | None = None,
    buckets: Buckets | None = None,
    topk_bound: int = DEFAULT_BOUND,
    fuse_projections: bool | None = None,
) -> SamplerOutput:
    """Sample `n` completions for each prompt from one set of parameters.

    Args:
      model: a `Decoder`, or a `ModelConfig` together with `params=`.
      prompt_ids: `B` prompts of token ids, of any lengths (a list of lists, or a
        `[B, L]` array); they are left-padded to a prompt bucket internally.
      max_new_tokens: tokens to generate at most per row.
      temperature: 0 means greedy (argmax); else logits are divided by it.
      top_p: nucleus mass in (0, 1]; 1 disables. top_k: 0 disables.
        Order and semantics as transformers (see `marljax.sampler.sampling`).
      stop: token-id sequences; a row stops when its completion ends with one
        (matched inside the completion only; the sequence is kept in the output).
      eos_ids: ids that end a row (kept in the output); default the config's
        `eos_token_id`; `()` for none.
      n: samples per prompt; the prompts are prefilled once and the cache is
        copied to the `n` samples.
      seed: row `r` uses the key `fold_in(key(seed), r)`, and step `t` of it
        `fold_in(row_key, t)`: results are reproducible and independent of batching.
      params: parameters to use instead of the model's own (any agent's
        parameters of the same shapes; no recompilation).
      return_sampling_logprobs: also return log-probs under the sampling distribution.
      pad_id: fills tokens past each row's end (default the config's pad id, else 0).
      mesh: run sharded on this mesh (default: the mesh of `params`, if sharded);
        batch over `data`/`fsdp`, heads over `tensor` (from the parameters' sharding).
      buckets, topk_bound, fuse_projections: shape buckets, the top-k fast-path size and
        whether decode uses fused q/k/v and gate/up weights (None: automatic); see `Engine`.

    Returns:
      a `SamplerOutput` with host (numpy) arrays.
    """
    config, params = _resolve(model, params)
    prompts = _as_prompts(prompt_ids)
    if not prompts:
        raise ValueError("prompt_ids is empty")
    V = config.vocab_size
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= V:
            raise ValueError(f"prompt {i} has token ids outside [0, {V})")
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(top_k, (int, np.integer)) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0, got {top_k!r}")
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")

    if mesh is None:
        mesh = mesh_of(params)
    engine: Engine = get_engine(config, mesh, buckets, topk_bound, fuse_projections)
    if pad_id is None:
        pad_id = config.pad_token_id if config.pad_token_id is not None else 0
    pad = int(pad_id)

    B, N = len(prompts), len(prompts) * n
    Bp, Bd = engine.batch_bucket(B), engine.batch_bucket(N)
    P = engine.prompt_bucket(max(len(p) for p in prompts))
    M = engine.new_tokens_bucket(int(max_new_tokens))

    ids = np.full((Bp, P), pad, np.int32)
    mask = np.zeros((Bp, P), bool)
    mask[B:, -1] = True  # padding rows: one dummy token, so attention is never empty
    for i, p in enumerate(prompts):
        ids[i, P - len(p) :] = p
        mask[i, P - len(p) :] = True
    cache, logits = engine.prefill(params, ids, mask, cache_len=P + M)

    src = np.zeros((Bd,), np.int32)
    src[:N] = np.arange(N) // n
    lens = np.array([len(p) for p in prompts] + [1] * (Bp - B), np.int32)
    live = np.arange(Bd) < N

    eos = _eos_ids(eos_ids, config)
    E = next_bucket(max(len(eos), 1), engine.buckets.min_eos)
    eos_arr = np.full((E,), -1, np.int32)
    eos_arr[: len(eos)] = eos
    stop = [list(map(int, s)) for s in (stop or [])]
    if any(len(s) == 0 for s in stop):
        raise ValueError("stop sequences must be non-empty")
    NS = next_bucket(max(len(stop), 1), engine.buckets.min_stop)
    Ls = next_bucket(max([len(s) for s in stop] + [1]), engine.buckets.min_stop_len)
    stop_seqs = np.full((NS, Ls), -2, np.int32)
    stop_valid = np.zeros((NS, Ls), bool)
    for j, s in enumerate(stop):
        stop_seqs[j, Ls - len(s) :] = s
        stop_valid[j, Ls - len(s) :] = True
    stop_active = np.arange(NS) < len(stop)

    greedy = temperature == 0
    toks, lps, slps, lengths, reason, steps = engine.decode(
        params,
        cache,
        logits,
        src=src,
        prompt_len=lens[src],
        live=live,
        seed=int(seed),
        temperature=np.full((Bd,), temperature, np.float32),
        top_k=np.full((Bd,), top_k, np.int32),
        top_p=np.full((Bd,), top_p, np.float32),
        eos=eos_arr,
        stop_seqs=stop_seqs,
        stop_valid=stop_valid,
        stop_active=stop_active,
        max_new=int(max_new_tokens),
        new_tokens_bucket=M,
        greedy=greedy,
        want_sampling_lp=return_sampling_logprobs,
        broadcast=not (n == 1 and Bd == Bp),
        pad_id=pad,
    )
    toks, lps, slps, lengths, reason, steps = jax.device_get((toks, lps, slps, lengths, reason, steps))
    engine.stats.last_steps = int(steps)
    T = int(max_new_tokens)
    return SamplerOutput(
        tokens=np.asarray(toks[:N, :T]),
        lengths=np.asarray(lengths[:N]),
        finish_reason=np.array([REASONS[int(r)] for r in reason[:N]]),
        logprobs=np.asarray(lps[:N, :T]),
        sampling_logprobs=np.asarray(slps[:N, :T]) if return_sampling_logprobs else None,
        prompt_index=np.arange(N, dtype=np.int32) // n,
        steps=int(steps),
    )


def generate_text(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    *,
    max_new_tokens: int,
    chat: bool = True,
    system: str | None = None,
    stop: Sequence[str] | None = None,
    eos_ids: Any = None,
    skip_special_tokens: bool = True,
    **kwargs: Any,
) -> TextOutput:
    """Text in, text out, through `tokenizer` (a transformers tokenizer).

    prompts: strings, or chat conversations (lists of `{"role", "content"}`
    messages). With `chat=True` (default) a string becomes one user message
    (after an optional `system` message) and every conversation goes through
    the tokenizer's chat template with the generation prompt; `chat=False`
    tokenizes strings as they are. stop: strings, tokenized on their own
    (`add_special_tokens=False`) into stop sequences -- the model must emit that
    tokenization; the decoded text is also cut at the first stop string.
    eos_ids: default the config's EOS ids plus the tokenizer's `eos_token_id`.
    Other keyword arguments go to `generate` (temperature, top_p, top_k, n, seed, params, ...).
    """
    config, _ = _resolve(model, kwargs.get("params"))
    texts_in: list[str] = []
    for p in prompts:
        if isinstance(p, str) and not chat:
            texts_in.append(p)
            continue
        if isinstance(p, str):
            msgs = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": p}
            ]
        else:
            msgs = list(p)
        texts_in.append(tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
    ids = [tokenizer.encode(t, add_special_tokens=not chat) for t in texts_in]
    if eos_ids is None:
        eos_ids = _eos_ids(None, config)
        if getattr(tokenizer, "eos_token_id", None) is not None and tokenizer.eos_token_id not in eos_ids:
            eos_ids.append(int(tokenizer.eos_token_id))
    stop_strs = list(stop or [])
    stop_ids = [tokenizer.encode(s, add_special_tokens=False) for s in stop_strs]
    out = generate(model, ids, max_new_tokens=max_new_tokens, stop=stop_ids, eos_ids=eos_ids, **kwargs)
    eos_set = set(_eos_ids(eos_ids, config))
    texts = []
    for row, length, why in zip(out.tokens, out.lengths, out.finish_reason):
        toks = row[:length].tolist()
        if why == "eos" and toks and toks[-1] in eos_set:
            toks = toks[:-1]
        text = tokenizer.decode(toks, skip_special_tokens=skip_special_tokens)
        cuts = [text.find(s) for s in stop_strs if s and s in text]
        if cuts:
            text = text[: min(cuts)]
        texts.append(text)
    return TextOutput(texts=texts, prompts=texts_in, output=out)
