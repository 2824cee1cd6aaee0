"""`marljax train`'s errors a new user meets first: one line each, naming the config file and key
(or the data file), never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from marljax.cli import main


def _config(tmp_path, model: dict, data: dict | None = None) -> str:
    cfg = {
        "name": "t",
        "run_dir": str(tmp_path / "run"),
        "policies": {"main": {"model": model}},
        "agents": {"solver": {"policy": "main"}},
        "data": {"source": data or {"kind": "synthetic", "n_train": 4}, "batch_size": 2},
        "workflow": {"kind": "grpo", "group_size": 2},
        "train": {"steps": 1, "progress": False, "log_to": []},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


def _error(capsys, *argv: str) -> str:
    """The command's one `error:` line (exit status 2, no traceback)."""
    assert main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and err.strip().endswith(lines[0]), err
    return lines[0]


def test_a_missing_model_directory_names_the_config_key(tmp_path, capsys):
    config = _config(tmp_path, {"path": str(tmp_path / "no-such-model")})
    line = _error(capsys, "train", config)
    assert line == f"error: {config}: policies.main.model.path: {tmp_path / 'no-such-model'}: not a directory"


def test_a_model_directory_without_tokenizer_files_is_an_error(tmp_path, capsys):
    from marljax.testing.tiny import write_random_checkpoint

    model = write_random_checkpoint(tmp_path / "model", tokenizer=False)
    config = _config(tmp_path, {"path": str(model)})
    line = _error(capsys, "train", config)
    assert line.startswith(f"error: {config}: policies.main.model.path: {model}: no tokenizer files"), line
    # a tokenizer directory set on its own is named by its own key
    line = _error(capsys, "train", config, f"policies.main.model.tokenizer={model}")
    assert line.startswith(f"error: {config}: policies.main.model.tokenizer: {model}: no tokenizer"), line


@pytest.mark.parametrize(
    "text, why",
    [
        (
            '{"eos_token_id": "<|im_end|>"}',
            "eos_token_id: expected a token id or a list of them, got '<|im_end|>'",
        ),
        ('{"eos_token_id": [2, null]}', "eos_token_id: expected a token id or a list of them, got [2, None]"),
        (
            '{"eos_token_id": 2,',
            "cannot read eos_token_id: Expecting property name enclosed in double quotes",
        ),
        ("[2]", "cannot read eos_token_id: not a JSON object"),
    ],
)
def test_a_bad_generation_config_names_the_file_and_key(tmp_path, capsys, text, why):
    from marljax.testing.tiny import write_random_checkpoint

    model = write_random_checkpoint(tmp_path / "model")
    (model / "generation_config.json").write_text(text)
    config = _config(tmp_path, {"path": str(model)})
    line = _error(capsys, "train", config)
    assert line.startswith(
        f"error: {config}: policies.main.model.path: {model / 'generation_config.json'}: {why}"
    ), line


@pytest.mark.parametrize("kind", ["jsonl", "qa"])
@pytest.mark.parametrize("split", ["train", "eval"])
def test_an_empty_dataset_file_is_named_with_its_key(tmp_path, capsys, kind, split):
    empty = tmp_path / f"{split}.jsonl"
    empty.write_text("\n")
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": "q", "question": "What is 6 * 7?", "answer": "42"}\n')
    files = {"train": str(good), split: str(empty)}
    config = _config(tmp_path, {"preset": "tiny-qwen3"}, {"kind": kind, **files})
    assert (
        _error(capsys, "train", config)
        == f"error: {empty}: no problems in data.source.{split} (the file is empty or holds only blank lines)"
    )


@pytest.mark.parametrize(
    "override, expected",
    [
        # unlike any name of the config: no "did you mean", but not a half-defined new policy either
        (
            "policies.actor.optimizer.lr=1e-4",
            "policies.actor: no policy 'actor' in the config; policies: main "
            "(a new one needs policies.actor.model or policies.actor.base)",
        ),
        ("agents.coder.role=Write code.", "agents.coder: no agent 'coder' in the config; agents: solver"),
        (
            "policies.mian.optimizer.lr=1e-4",
            "policies.mian: no policy 'mian' in the config; did you mean 'main'?",
        ),
    ],
)
def test_a_mistyped_name_in_an_override_is_one_line(tmp_path, capsys, override, expected):
    config = _config(tmp_path, {"preset": "tiny-qwen3"})
    assert _error(capsys, "train", config, override).startswith(f"error: <overrides>: {expected}")
    assert not (tmp_path / "run").exists()


def test_a_new_policy_and_agent_from_overrides_still_load(tmp_path):
    from marljax.train.config import load_config

    config = _config(tmp_path, {"preset": "tiny-qwen3"})
    cfg = load_config(
        config,
        ["policies.second.model.preset=tiny-llama", "agents.helper.policy=second", "workflow.agent=solver"],
    )
    assert sorted(cfg.policies) == ["main", "second"] and cfg.agents["helper"].policy == "second"


def test_a_module_the_config_names_is_found_in_the_current_directory(tmp_path):
    """`train.sft_teacher.script` (and `workflow.module`) in the directory `marljax` runs in, with
    the host-memory restart (a `python -m marljax.cli` child, which has the directory on its path)
    off, in a Python that puts nothing of its own there (`-I`, as the `marljax` console script)."""
    import os
    import subprocess
    import sys

    (tmp_path / "my_teacher.py").write_text("def teach(seed):\n    return lambda agent, prompt, k, s: 'x'\n")
    config = yaml.safe_load(Path(_config(tmp_path, {"preset": "tiny-qwen3"})).read_text())
    config["train"]["sft_teacher"] = {"script": "my_teacher:teach"}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    got = subprocess.run(
        [sys.executable, "-I", "-c", "import sys; from marljax.cli import main; sys.exit(main())"]
        + ["train", "run.yaml", "train.steps=0"],  # an error of its own: the command stops at the config
        cwd=tmp_path,
        env={**os.environ, "MARLJAX_KEEP_HOST_MEMORY": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert got.returncode == 2, got.stderr
    assert "train.steps" in got.stderr and "my_teacher" not in got.stderr, got.stderr
