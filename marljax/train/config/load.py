"""Loading a run configuration: one YAML file plus `dotted.key=value` overrides -> `RunConfig`.

All problems are reported together in one `ConfigError`, one per line, each
naming the file (or `<overrides>` when an override set the key) and the full
dotted key, with "did you mean" for a misspelt key. The schema itself is in
`schema.py`.
"""

from __future__ import annotations

import copy
import difflib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError

from marljax.settings import resolve_annotation
from marljax.train.config.schema import RunConfig, workflow_kinds
from marljax.train.files import report, set_aside_path, write_atomically

logger = logging.getLogger(__name__)

__all__ = ["ConfigError", "apply_overrides", "config_from_dict", "dump_config", "load_config"]

OVERRIDES = "<overrides>"


class ConfigError(ValueError):
    """Invalid configuration; `problems` holds one `<file>: <key>: <what is wrong>` line per problem."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        n = len(self.problems)
        super().__init__(f"{n} problem{'s' if n != 1 else ''} in config:\n" + "\n".join(self.problems))


def _split_override(item: str) -> tuple[tuple[str, ...], Any]:
    key, eq, raw = item.partition("=")
    parts = tuple(p.strip() for p in key.split("."))
    if not eq:
        raise ValueError("expected dotted.key=value")
    if not all(parts):
        raise ValueError("empty key")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw  # e.g. a template `{role}: {problem}` is not valid YAML; take it verbatim
    return parts, value


# top-level mappings of named entries, where a key of an override may add an entry
NAMED_ENTRIES = {"policies": "policy", "agents": "agent"}
# the keys that make an entry added by overrides a real one (either of them)
DEFINING_KEYS = {"policies": ("model", "base"), "agents": ("policy",)}


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict:
    """A copy of `data` with each `dotted.key=value` set in order (value parsed as YAML). A key
    that would add a policy or agent named almost like one the config has is an error naming
    that one, and so is a new entry the overrides leave without its model (policy) or policy
    (agent): a typo would otherwise make a half-defined entry and a misleading message."""
    out = copy.deepcopy(dict(data))
    errors = []
    for item in overrides:
        try:
            parts, value = _split_override(item)
        except ValueError as e:
            errors.append(f"{OVERRIDES}: {item.partition('=')[0] or '<empty>'}: {e} (got {item!r})")
            continue
        if len(parts) > 2 and parts[0] in NAMED_ENTRIES and isinstance(out.get(parts[0]), dict):
            names = out[parts[0]]
            close = difflib.get_close_matches(parts[1], list(names), n=1)
            if parts[1] not in names and close:  # a typo, which would add a half-defined entry
                errors.append(
                    f"{OVERRIDES}: {parts[0]}.{parts[1]}: no {NAMED_ENTRIES[parts[0]]} {parts[1]!r} in the "
                    f"config; did you mean {close[0]!r}? (a new one needs a name unlike the others')"
                )
                continue
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:  # absent or explicit null: create the mapping
                child = node[part] = {}
            if not isinstance(child, dict):
                errors.append(
                    f"{OVERRIDES}: {'.'.join(parts[: i + 1])}: cannot set {'.'.join(parts[i + 1 :])!r} "
                    f"inside a non-mapping value (got {child!r})"
                )
                break
            node = child
        else:
            node[parts[-1]] = value
    # An entry the overrides added without its defining key is a typo of a name (one too unlike
    # the config's for "did you mean"), not a new policy or agent: say so rather than report the
    # half-defined entry's missing keys.
    for section, what in NAMED_ENTRIES.items():
        before, after = data.get(section), out.get(section)
        if not isinstance(after, dict) or not isinstance(before, dict):
            continue
        for name in sorted(after.keys() - before.keys()):
            entry, keys = after[name], DEFINING_KEYS[section]
            if isinstance(entry, dict) and not any(entry.get(k) is not None for k in keys):
                errors.append(
                    f"{OVERRIDES}: {section}.{name}: no {what} {name!r} in the config; "
                    f"{section}: {', '.join(sorted(before))} (a new one needs "
                    f"{' or '.join(f'{section}.{name}.{k}' for k in keys)})"
                )
    if errors:
        raise ConfigError(errors)
    return out


def _model_at(loc: Sequence[Any]) -> type[BaseModel] | None:
    """The model class that validates the mapping at `loc`, if it can be told from the schema."""
    tp: Any = RunConfig
    for part in loc:
        tp = resolve_annotation(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part)
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        else:
            return None
    tp = resolve_annotation(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _exists(data: Any, loc: Sequence[Any]) -> int:
    """How many leading parts of `loc` exist in `data`."""
    for n, part in enumerate(loc):
        if not isinstance(data, dict) or part not in data:
            return n
        data = data[part]
    return len(loc)


def _lines(err: ValidationError, source: str, original: Any, touched: Sequence[tuple]) -> list[str]:
    lines = []
    for e in err.errors():
        loc = list(e["loc"])
        if len(loc) >= 2 and loc[0] == "workflow" and loc[1] in workflow_kinds():
            del loc[1]  # pydantic puts the union tag in the path; the YAML has no such level
        if e["type"] == "config":  # our cross-field checks: expand each with its own key
            found = [(loc + list(sub), msg, value, True) for sub, msg, value in e["ctx"]["problems"]]
        elif e["type"] in ("union_tag_invalid", "union_tag_not_found"):
            if isinstance(e["input"], dict):
                found = [
                    (
                        loc + ["kind"],
                        f"unknown workflow kind; known: {', '.join(workflow_kinds())}",
                        e["input"].get("kind"),
                        True,
                    )
                ]
            else:
                found = [(loc, "expected a mapping", e["input"], True)]
        elif e["type"] == "missing":
            found = [(loc, "missing required key", None, False)]
        elif e["type"] == "extra_forbidden":
            model = _model_at(loc[:-1])
            msg = "unknown key"
            if model is not None:
                fields = list(model.model_fields)
                close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
                msg += f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(fields)}"
            found = [(loc, msg, e["input"], True)]
        else:
            msg = e["msg"].removeprefix("Value error, ")
            found = [(loc, msg, e["input"], True)]
        for key, msg, value, show in found:
            # Blame the overrides when the key, or the new subtree holding it, came from one.
            n = _exists(original, key)
            from_override = any(
                tuple(key[: len(t)]) == t or (n < len(key) and tuple(key[: n + 1]) == t[: n + 1])
                for t in touched
            )
            where = OVERRIDES if from_override else source
            dotted = ".".join(map(str, key)) or "<root>"
            lines.append(f"{where}: {dotted}: {msg}" + (f" (got {_short(value)})" if show else ""))
    return lines


def _validate(data: Any, source: str, original: Any = None, touched: Sequence[tuple] = ()) -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: <root>: expected a mapping of settings (got {_short(data)})"])
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_lines(err, source, data if original is None else original, touched)) from None


def config_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> RunConfig:
    """Validate a plain mapping (as read from YAML) into a `RunConfig`; errors name `source`."""
    return _validate(dict(data) if isinstance(data, Mapping) else data, source)


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> RunConfig:
    """Read a YAML run config, apply `dotted.key=value` overrides in order, and validate."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError([f"{source}: <root>: cannot read file: {e.strerror or e}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "<root>"
        what = getattr(e, "problem", None) or str(e)
        raise ConfigError([f"{source}: {where}: YAML syntax error: {what}"]) from None
    if data is None:
        data = {}  # an empty file: report the missing keys rather than "not a mapping"
    if not isinstance(data, dict):
        raise ConfigError([f"{source}: <root>: expected a mapping of settings (got {_short(data)})"])
    merged = apply_overrides(data, overrides)
    touched = [_split_override(o)[0] for o in overrides]
    return _validate(merged, source, data, touched)


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write `cfg` as YAML that `load_config` reads back into an equal config."""
    # whole or not at all: a torn record would refuse every rerun of the run it describes
    write_atomically(
        Path(path), yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False, default_flow_style=False)
    )


# settings a run can change and still resume as the same run: how long it goes and what it logs
RESUMABLE_CHANGES = (
    "train.steps",
    "train.save_every",
    "train.keep_checkpoints",
    "train.async_checkpoint",
    "train.log_every",
    "train.eval_every",
    "train.log_to",
    "train.wandb.project",
    "train.wandb.entity",
    "train.wandb.mode",
    "train.progress",
    "train.log_rollouts",
    "train.agent_grad_norms",
)


def _log_to(train: dict, tensorboard: Any) -> None:
    train.setdefault("log_to", ["tensorboard"] if tensorboard else [])


def _max_rounds(train: dict, rounds: Any) -> None:
    # Written beside `dynamic_sampling: true|false`, the switch before it held settings; that
    # version kept problems by advantage and trained on the first round when none taught.
    if train.get("dynamic_sampling") is True:
        train["dynamic_sampling"] = {"keep": "advantage", "max_rounds": rounds, "when_none": "train"}


# `train` keys older versions wrote in run records, and how each is written in today's form
RENAMED_IN_RECORDS = {"tensorboard": _log_to, "max_sampling_rounds": _max_rounds}


def upgrade_record(record: dict) -> dict:
    """A copy of a run record (a dumped config) with keys renamed since older versions wrote it
    in today's form, so that a run started by one resumes or is refused by its real settings."""
    record = copy.deepcopy(record)
    train = record.get("train")
    if isinstance(train, dict):
        for key, rewrite in RENAMED_IN_RECORDS.items():
            if key in train:
                rewrite(train, train.pop(key))
    return record


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict) and tree:
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


def _same(a: Any, b: Any) -> bool:
    """Equal settings, counting a relative and an absolute path to one existing file as equal."""
    if a == b:
        return True
    return (
        isinstance(a, str)
        and isinstance(b, str)
        and (os.path.exists(a) or os.path.exists(b))
        and os.path.realpath(a) == os.path.realpath(b)
    )


def config_changes(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """`(dotted key, old value, new value)` for every setting that differs between two dumped
    configs (`cfg.model_dump(mode="json")`); a key only one of them has counts with value None."""
    a, b = _flat(old), _flat(new)
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if not _same(a.get(k), b.get(k))]


def config_to_record(cfg: RunConfig, run_dir: str | Path, now: str) -> Path | None:
    """Where to record `cfg` in a run directory that keeps its history of configs: `config.yaml`
    holds the config the run started with, and a rerun whose changes resume safely
    (`RESUMABLE_CHANGES`) adds `config-<now>.yaml`; None when `cfg` is the newest recorded config
    (the one a rerun is compared with). Any other change is a ConfigError listing the
    differences: the caller checks before it touches the directory and writes (`dump_config`)
    once the run really starts. The record is compared as a config (validated, so settings added
    to marljax since it was written take their defaults and are no change). A record that is not
    a config (damaged storage: not YAML, not a mapping, cut short) is moved to
    ``RUN_DIR/set_aside/`` with a warning, and the next older one is compared instead."""
    run_dir = Path(run_dir)
    recorded = [p for p in (run_dir / "config.yaml", *sorted(run_dir.glob("config-*.yaml"))) if p.exists()]
    while recorded:
        latest = recorded.pop()
        try:
            old = yaml.safe_load(latest.read_text(encoding="utf-8"))
            why = "" if isinstance(old, dict) else f"it holds {type(old).__name__}, not a mapping"
            if not why:
                old = RunConfig.model_validate(upgrade_record(old)).model_dump(mode="json")
        except (ValueError, yaml.YAMLError) as e:  # ValueError: bytes that are not UTF-8, or not a config
            why = f"{type(e).__name__}: {e}"
        if not why:
            break
        kept = set_aside_path(run_dir, latest.name)
        os.replace(latest, kept)
        report(
            logger,
            f"{latest} is not a config record this version reads (damaged, or written by another "
            f"marljax version: {why[:500]}): moved to {kept}",
        )
    else:
        return run_dir / "config.yaml"
    changes = config_changes(old, cfg.model_dump(mode="json"))
    if not changes:
        return None
    refused = [c for c in changes if c[0] not in RESUMABLE_CHANGES]
    if refused:
        raise ConfigError(
            [
                f"{run_dir}: {key}: {old!r} in the run's {latest.name}, {value!r} now"
                for key, old, value in refused
            ]
            + [
                f"{run_dir}: <root>: a changed run needs its own run_dir (or restore {latest.name}'s settings)"
            ]
        )
    return run_dir / f"config-{now}.yaml"
