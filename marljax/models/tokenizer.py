"""The tiny tokenizer: a byte-level BPE with the Qwen family's ChatML markup, learnt in a second.

A random-init preset (`ModelConfig.preset`) comes without a tokenizer; this one is its default,
and the test fixtures (`marljax.testing`) save it beside their tiny checkpoints. Its special tokens
are ChatML's (`marljax.models.families.QWEN_CHAT`) at the first ids, so every tiny vocabulary
holds them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from marljax.models.families import QWEN_CHAT

SPECIAL_TOKENS = QWEN_CHAT.specials  # "<|endoftext|>", "<|im_start|>", "<|im_end|>": ids 0, 1, 2
PAD_ID, IM_START_ID, EOS_ID = 0, 1, 2

# generic lines the merges are learnt from when no corpus is given
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Agents cooperate: the coder writes, the tester checks, the reviewer decides.",
    "1 + 1 = 2, 2 * 3 = 6, 10 / 4 = 2.5",
    "for i in range(10):\n    print(i * i)\n",
    "Question: what is the capital of France? Answer: Paris.",
] * 4


def make_tokenizer(
    path: str | os.PathLike | None = None, vocab_size: int = 320, corpus: Sequence[str] | None = None
):
    """A byte-level BPE `PreTrainedTokenizerFast` with ChatML specials and chat template.

    Ids: `<|endoftext|>` = 0 (pad), `<|im_start|>` = 1, `<|im_end|>` = 2 (eos);
    `vocab_size` <= 512 fits every tiny model. BPE merges are learnt from
    `corpus` (default: `CORPUS`). Saved to `path` when given
    (loadable with `transformers.AutoTokenizer.from_pretrained(path)`).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS if corpus is None else corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        additional_special_tokens=[SPECIAL_TOKENS[IM_START_ID]],
    )
    fast.chat_template = QWEN_CHAT.template
    if path is not None:
        fast.save_pretrained(str(path))
    return fast
