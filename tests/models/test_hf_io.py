"""Hugging Face checkpoints in and out: round trips, sharded files, tokenizer, bad input."""

from __future__ import annotations

import json
import shutil

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from marljax import testing
from marljax.models import (
    CheckpointError,
    ModelConfig,
    from_pretrained,
    load_tokenizer,
    save_pretrained,
)


def _tensors(path):
    out = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


@pytest.mark.parametrize("case", ["qwen2-untied-gqa2", "qwen3-tied-gqa2", "llama-linearrope-bias-tied"])
def test_hf_to_marljax_to_hf_is_identical_and_loads_in_transformers(checkpoint, tmp_path, case):
    import torch
    import transformers

    src = checkpoint(case)
    model, config = from_pretrained(src)
    save_pretrained(model, tmp_path / "out")
    a, b = _tensors(src), _tensors(tmp_path / "out")
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    # config survives the trip, and transformers loads the directory and computes the same logits
    _, config2 = from_pretrained(tmp_path / "out")
    assert config2 == config
    ids = torch.tensor(np.random.RandomState(0).randint(3, 512, (2, 6)))
    with torch.no_grad():
        want = transformers.AutoModelForCausalLM.from_pretrained(str(src)).eval()(ids).logits
        got = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out")).eval()(ids).logits
    assert torch.equal(want, got)


@pytest.mark.parametrize(
    "family,overrides",
    [
        ("qwen3", {}),
        ("llama", dict(rope_scaling=None, head_dim=24)),
        ("qwen2", dict(tie_word_embeddings=True)),
    ],
)
def test_torch_free_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path, family, overrides):
    # The demo's checkpoints: written by marljax without torch, read by transformers as they are.
    torch = pytest.importorskip(
        "torch", reason="the transformers side of this check needs torch ([test] extra)"
    )
    import transformers

    from marljax.testing import write_random_checkpoint

    path = write_random_checkpoint(tmp_path / family, family, seed=3, **overrides)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(path), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    assert reference.config.model_type == family
    assert transformers.AutoTokenizer.from_pretrained(str(path)).eos_token_id == testing.EOS_ID
    ids = np.random.RandomState(0).randint(3, 512, (2, 7))
    with torch.no_grad():
        want = reference(torch.tensor(ids)).logits.numpy()
    model, _ = from_pretrained(path)
    np.testing.assert_allclose(np.asarray(model(jnp.asarray(ids))[0]), want, rtol=2e-4, atol=2e-4)
    # seeded: the same seed writes the same weights, another seed other ones
    again = write_random_checkpoint(tmp_path / "again", family, seed=3, tokenizer=False, **overrides)
    other = write_random_checkpoint(tmp_path / "other", family, seed=4, tokenizer=False, **overrides)
    a, b, c = _tensors(path), _tensors(again), _tensors(other)
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["model.embed_tokens.weight"], c["model.embed_tokens.weight"])


def test_bfloat16_checkpoint_round_trip_is_bit_exact(tmp_path):
    src = testing.make_tiny_checkpoint(tmp_path / "src", "qwen3", dtype="bfloat16", tokenizer=False)
    model, cfg = from_pretrained(src, dtype="bfloat16")
    assert cfg.param_dtype == "bfloat16"
    save_pretrained(model, tmp_path / "out")
    a, b = _tensors(src), _tensors(tmp_path / "out")
    assert sorted(a) == sorted(b)
    assert all(str(b[n].dtype) == "bfloat16" and np.array_equal(a[n], b[n]) for n in a)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"


def test_sharded_save_and_load(checkpoint, tmp_path):
    src = checkpoint("qwen2-untied-gqa2")
    model, _ = from_pretrained(src)
    save_pretrained(model, tmp_path / "out", max_shard_size=60_000)  # ~0.4 MB model -> several files
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2 and not (tmp_path / "out" / "model.safetensors").exists()
    again, _ = from_pretrained(tmp_path / "out")
    ids = jnp.asarray(np.random.RandomState(0).randint(3, 512, (2, 6)))
    np.testing.assert_array_equal(model(ids)[0], again(ids)[0])
    a, b = _tensors(src), _tensors(tmp_path / "out")
    assert sorted(a) == sorted(b) and all(np.array_equal(a[n], b[n]) for n in a)


def test_a_directory_without_tokenizer_files_is_an_error_naming_them(checkpoint, tmp_path):
    # transformers builds a tokenizer from tokenizer_config.json alone, with an empty vocabulary
    src = checkpoint("qwen3-tied-gqa2")
    bare = tmp_path / "bare"
    shutil.copytree(src, bare)
    for name in ("tokenizer.json", "vocab.json", "merges.txt", "tokenizer.model"):
        (bare / name).unlink(missing_ok=True)
    assert (bare / "tokenizer_config.json").exists()
    with pytest.raises(CheckpointError, match=r"bare: no tokenizer files \(one of tokenizer.json"):
        load_tokenizer(bare)
    with pytest.raises(CheckpointError, match="nope: not a directory"):
        load_tokenizer(tmp_path / "nope")
    assert len(load_tokenizer(src)) > 100


def test_tokenizer_and_chat_template(checkpoint):
    tok = load_tokenizer(checkpoint("qwen3-tied-gqa2"))
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == testing.IM_START_ID and testing.EOS_ID in ids and max(ids) < 512
    assert tok.decode(ids) == text
    assert tok.eos_token_id == testing.EOS_ID and tok.pad_token_id == testing.PAD_ID


# ----------------------------------------------------------------- bad input
@pytest.fixture
def good_dir(tmp_path):
    """A valid checkpoint written by marljax itself (fast; no torch)."""
    from marljax.testing import random_model

    path = tmp_path / "ckpt"
    save_pretrained(random_model(ModelConfig.preset("tiny-qwen2", num_layers=1)), path)
    return path


def _edit_config(path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _rewrite_weights(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_directory_config_or_weights(tmp_path, good_dir):
    with pytest.raises(CheckpointError, match="not a directory"):
        from_pretrained(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        from_pretrained(tmp_path / "empty")
    (good_dir / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights.*model.safetensors"):
        from_pretrained(good_dir)


def test_unsupported_architecture_and_options(good_dir):
    _edit_config(good_dir, architectures=["GPT2LMHeadModel"])
    with pytest.raises(CheckpointError, match="GPT2LMHeadModel"):
        from_pretrained(good_dir)
    _edit_config(good_dir, architectures=["Qwen2ForCausalLM"], hidden_act="gelu")
    with pytest.raises(CheckpointError, match="hidden_act"):
        from_pretrained(good_dir)
    _edit_config(
        good_dir,
        hidden_act="silu",
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0},
    )
    with pytest.raises(CheckpointError, match="yarn"):
        from_pretrained(good_dir)


def test_wrong_shape_names_tensor_and_file(good_dir):
    name = "model.layers.0.self_attn.k_proj.weight"
    _rewrite_weights(good_dir, lambda t: t.__setitem__(name, np.zeros((16, 64), np.float32)))
    with pytest.raises(CheckpointError, match=rf"model.safetensors.*{name}.*\[16, 64\].*\[32, 64\]"):
        from_pretrained(good_dir)


def test_missing_and_unexpected_tensors(good_dir):
    shutil.copy(good_dir / "model.safetensors", good_dir / "orig")
    _rewrite_weights(good_dir, lambda t: t.pop("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match="missing tensor.*model.layers.0.mlp.up_proj.weight"):
        from_pretrained(good_dir)
    shutil.copy(good_dir / "orig", good_dir / "model.safetensors")
    _rewrite_weights(
        good_dir,
        lambda t: t.__setitem__("model.layers.1.mlp.up_proj.weight", np.zeros((128, 64), np.float32)),
    )
    with pytest.raises(CheckpointError, match="unexpected tensor.*model.layers.1.mlp.up_proj.weight"):
        from_pretrained(good_dir)


def test_sharded_index_pointing_at_missing_file(good_dir, tmp_path):
    model, _ = from_pretrained(good_dir)
    out = save_pretrained(model, tmp_path / "sharded", max_shard_size=20_000)
    victim = sorted(out.glob("model-*.safetensors"))[-1]
    victim.unlink()
    with pytest.raises(CheckpointError, match=victim.name):
        from_pretrained(out)
