"""Public entry points: `generate` (token ids in, tokens + log-probs out) and `generate_text`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from marljax.models import Decoder, ModelConfig, get_params
from marljax.models.lora import num_adapters
from marljax.sampler.engine import Engine, get_engine, mesh_of
from marljax.sampler.sampling import DEFAULT_BOUND
from marljax.sampler.schedule import Buckets, Completion, Request, SamplingParams, Schedule


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
    """

    tokens: np.ndarray
    lengths: np.ndarray
    finish_reason: np.ndarray
    logprobs: np.ndarray
    sampling_logprobs: np.ndarray | None
    prompt_index: np.ndarray

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


def _requests(config: ModelConfig, prompt_ids, sampling, n, seed, adapter=0) -> list[Request]:
    """Checked arguments as requests: sample `j` of prompt `i` is request `i * n + j`."""
    prompts = _as_prompts(prompt_ids)
    if not prompts:
        raise ValueError("prompt_ids is empty")
    V = config.vocab_size
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt {i} is empty")
        if min(p) < 0 or max(p) >= V:
            raise ValueError(f"prompt {i} has token ids outside [0, {V})")
    B = len(prompts)
    settings = _per_prompt(sampling, "sampling", B, lambda s: isinstance(s, SamplingParams), "SamplingParams")
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    is_int = (int, np.integer)
    adapters = _per_prompt(adapter, "adapter", B, lambda a: isinstance(a, is_int) and a >= 0, "an int >= 0")
    if not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")
    return [
        Request(np.asarray(p, np.int32), s, adapter=int(a))
        for p, s, a in zip(prompts, settings, adapters)
        for _ in range(n)
    ]


def _per_prompt(value, name: str, count: int, valid, what: str) -> list:
    """`value` as one entry per prompt: a single value is repeated, a sequence must have `count`
    entries; each entry must pass `valid` (else a ValueError naming `name` and `what`)."""
    values = list(value) if isinstance(value, (list, tuple, np.ndarray)) else [value] * count
    if len(values) != count or not all(valid(v) for v in values):
        raise ValueError(f"{name} must be {what}, one value or one per prompt; got {value!r}")
    return values


def _pad_id(config, pad_id: int | None) -> int:
    if pad_id is not None:
        return int(pad_id)
    return config.pad_token_id if config.pad_token_id is not None else 0


def generate_stream(
    model: Any,
    prompt_ids: Any,
    sampling: SamplingParams | Sequence[SamplingParams],
    *,
    n: int = 1,
    seed: int = 0,
    params: Any = None,
    stop: Sequence[Sequence[int]] | None = None,
    eos_ids: int | Sequence[int] | None = None,
    adapter: int | Sequence[int] = 0,
    return_sampling_logprobs: bool = False,
    pad_id: int | None = None,
    mesh: Mesh | None = None,
    buckets: Buckets | None = None,
    schedule: Schedule | None = None,
    topk_bound: int = DEFAULT_BOUND,
    fuse_projections: bool | None = None,
    cache_layout: str | None = None,
    page_size: int = 16,
    num_pages: int | None = None,
    cache_budget: int | None = None,
) -> Iterator[Completion]:
    """`generate`'s completions one by one, in the order they finish (`Completion.index` is
    the row of `generate`'s output: sample `j` of prompt `i` is `i * n + j`); the arguments are
    `generate`'s."""
    config, params = _resolve(model, params)
    requests = _requests(config, prompt_ids, sampling, n, seed, adapter)
    if any(r.adapter for r in requests):
        count = num_adapters(params["lora"]) if "lora" in params else 1
        if max(r.adapter for r in requests) >= count:
            raise ValueError(f"adapter index out of range: params hold {count} adapter(s)")
    stop = [list(map(int, s)) for s in (stop or [])]
    if any(len(s) == 0 for s in stop):
        raise ValueError("stop sequences must be non-empty")
    if mesh is None:
        mesh = mesh_of(params)
    engine: Engine = get_engine(
        config,
        mesh,
        buckets,
        topk_bound,
        fuse_projections,
        cache_layout=cache_layout,
        page_size=page_size,
        num_pages=num_pages,
        cache_budget=cache_budget,
    )
    return engine.run(
        params,
        requests,
        seed=int(seed),
        eos=_eos_ids(eos_ids, config),
        stop=stop,
        schedule=schedule or Schedule(),
        want_sampling_lp=return_sampling_logprobs,
        pad_id=_pad_id(config, pad_id),
    )


def generate(
    model: Any, prompt_ids: Any, sampling: SamplingParams | Sequence[SamplingParams], **call
) -> SamplerOutput:
    """Sample `n` completions for each prompt from one set of parameters.

    Requests are batched continuously (`marljax.sampler.engine`): at most `schedule.slots`
    decode at once, each with its own cache positions; a finished row's slot takes the next
    waiting request, and requests sharing a prompt prefix prefill it once.

    Args:
      model: a `Decoder`, or a `ModelConfig` together with `params=`.
      prompt_ids: `B` prompts of token ids, of any lengths (a list of lists, or a `[B, L]` array).
      sampling: how to sample (`SamplingParams`: budget, temperature, top-p, top-k): one for
        every prompt, or one per prompt. Its stop strings are not read: see `stop`.
      call: keyword arguments, as `generate_stream` names them:
      n: samples per prompt (they share the prompt's prefill).
      seed: row `r` uses the key `fold_in(key(seed), r)`, and its token `t`
        `fold_in(row_key, t)`: results are reproducible and independent of batching and slots.
      params: parameters to use instead of the model's own (any agent's
        parameters of the same shapes; no recompilation).
      stop: token-id sequences; a row stops when its completion ends with one
        (matched inside the completion only; the sequence is kept in the output).
      eos_ids: ids that end a row (kept in the output); default the config's
        `eos_token_id`; `()` for none.
      adapter: with LoRA adapters in `params["lora"]` (`marljax.models.lora.stack_adapters`),
        the adapter of each prompt's rows (one int, or one per prompt): rows of different
        adapters of one base decode in one batch.
      return_sampling_logprobs: also return log-probs under the sampling distribution.
      pad_id: fills tokens past each row's end (default the config's pad id, else 0).
      mesh: run sharded on this mesh (default: the mesh of `params`, if sharded);
        slots over `data`/`fsdp`, heads over `tensor` (from the parameters' sharding).
      buckets, schedule: shape buckets and how requests share the slots (`Schedule`).
      topk_bound, fuse_projections: the top-k fast-path size and whether decode uses fused
        q/k/v and gate/up weights (None: automatic); see `Engine`.
      cache_layout, page_size, num_pages, cache_budget: the KV cache (None: the backend's dense
        layout; "paged": a pool of `num_pages` pages, or `cache_budget` bytes of them, of
        `page_size` positions); see `Engine`.

    Returns:
      a `SamplerOutput` with host (numpy) arrays.
    """
    config, call["params"] = _resolve(model, call.get("params"))
    done = sorted(generate_stream(config, prompt_ids, sampling, **call), key=lambda c: c.index)
    settings = [sampling] if isinstance(sampling, SamplingParams) else sampling
    N, T = len(done), max(s.max_new_tokens for s in settings)
    tokens = np.full((N, T), _pad_id(config, call.get("pad_id")), np.int32)
    logprobs = np.zeros((N, T), np.float32)
    sampling_lp = np.zeros((N, T), np.float32) if call.get("return_sampling_logprobs") else None
    for c in done:
        k = len(c.tokens)
        tokens[c.index, :k], logprobs[c.index, :k] = c.tokens, c.logprobs
        if sampling_lp is not None:
            sampling_lp[c.index, :k] = c.sampling_logprobs
    return SamplerOutput(
        tokens=tokens,
        lengths=np.array([len(c.tokens) for c in done], np.int32),
        finish_reason=np.array([c.finish_reason for c in done]),
        logprobs=logprobs,
        sampling_logprobs=sampling_lp,
        prompt_index=np.arange(N, dtype=np.int32) // call.get("n", 1),
    )


def generate_text(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Any],
    sampling: SamplingParams,
    *,
    chat: bool = True,
    system: str | None = None,
    eos_ids: Any = None,
    skip_special_tokens: bool = True,
    **call: Any,
) -> TextOutput:
    """Text in, text out, through `tokenizer` (a transformers tokenizer).

    prompts: strings, or chat conversations (lists of `{"role", "content"}`
    messages). With `chat=True` (default) a string becomes one user message
    (after an optional `system` message) and every conversation goes through
    the tokenizer's chat template with the generation prompt; `chat=False`
    tokenizes strings as they are. `sampling.stop`: strings, tokenized on their own
    (`add_special_tokens=False`) into stop sequences -- the model must emit that
    tokenization; the decoded text is also cut at the first stop string.
    eos_ids: default the config's EOS ids plus the tokenizer's `eos_token_id`.
    Other keyword arguments go to `generate` (n, seed, params, ...).
    """
    config, _ = _resolve(model, call.get("params"))
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
    stop_strs = list(sampling.stop)
    stop_ids = [tokenizer.encode(s, add_special_tokens=False) for s in stop_strs]
    out = generate(model, ids, sampling, stop=stop_ids, eos_ids=eos_ids, **call)
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
