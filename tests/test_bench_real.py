"""The real-shape rehearsal (`benchmarks/bench_real.py`) at 1 layer: every phase runs and checks out.

Real vocabularies, widths, special-token ids and chat templates of Qwen2.5-0.5B and Llama-3.2-1B;
1 layer each and 8 new tokens, so it takes a few minutes of CPU rather than most of an hour.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[1]


def _bench_real():
    return load_script(ROOT / "benchmarks" / "bench_real.py", "bench_real")


def test_family_tokenizers_put_specials_at_the_real_ids_and_render_the_chat_markup():
    from marljax.models.chat import encode_prompt
    from marljax.testing.real_shapes import make_family_tokenizer

    class Prompt(str):
        messages = (("system", "Be brief."), ("user", "Add 2 and 3."))

    qwen, llama = make_family_tokenizer("qwen2"), make_family_tokenizer("llama")
    assert len(qwen) == 151646 and len(llama) == 128256
    assert qwen.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [
        151643,
        151644,
        151645,
    ]
    assert (qwen.eos_token_id, qwen.pad_token_id) == (151645, 151643)
    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ]
    assert llama.convert_tokens_to_ids(specials) == [128000, 128001, 128006, 128007, 128009]
    assert (llama.bos_token_id, llama.eos_token_id) == (128000, 128009)
    q = qwen.decode(encode_prompt(qwen, Prompt(), chat=True))
    assert (
        q
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAdd 2 and 3.<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = encode_prompt(llama, Prompt(), chat=True)
    assert ids[0] == 128000 and ids.count(128000) == 1  # the template's, not a second from the post-processor
    assert llama.decode(ids) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAdd 2 and 3.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert llama("hi")["input_ids"][0] == 128000  # plain text gets Llama 3's bos, as the real one does


@pytest.mark.slow(seconds=180)
def test_rehearsal_at_real_width_and_vocabulary(tmp_path, monkeypatch):
    # its phases' processes run at XLA's default code generation, not the suite's quick compiles:
    # at real width they are execution-bound (10 % quicker so)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    bench = _bench_real()
    out = bench.run(layers=1, max_new_tokens=8, repeats=1, work=tmp_path)
    build, train, resume, compare = out["build"], out["train"], out["resume"], out["compare"]

    assert set(build) >= {"qwen2.5-0.5b", "llama-3.2-1b"}
    assert {"load", "step", "eval", "checkpoint"} <= set(train["phases"])
    # both policies sampled in the step and in evaluation, and each made its one update
    assert {(s["policy"], s["phase"]) for s in train["sampling"]} == {
        (p, ph) for p in ("coder_qwen", "coder_llama") for ph in ("step", "eval")
    }
    assert train["versions"] == {"coder_qwen": 1, "coder_llama": 1} and set(train["updates"]) == set(
        train["versions"]
    )
    assert all(m["ok"] for m in train["markup"].values()), train[
        "markup"
    ]  # prompts carry the family's markup
    # SIGKILLed after its checkpoint; a fresh process resumes with the very same parameters
    assert train["killed"] and resume["resumed"] and resume["step"] == 1
    assert resume["digests"] == train["digests"] and resume["versions"] == train["versions"]
    for name, e in resume["export"].items():  # transformers reloads the export with equal logits
        assert e["max_abs_logit_diff"] < 1e-3 * max(1.0, e["logit_scale"]), (name, e)
        assert e["chat_ok"], e["chat_template"]
    assert compare["entropy_rel_diff"] < 1e-3  # same weights, same batch on both sides
    assert compare["marljax"]["seconds"] > 0 and compare["transformers"]["seconds"] > 0
    m = bench.memory_summary(train)
    assert m["estimate"] > 0 and m["measured"] > 0
    assert "Kill and resume" in out["markdown"]
