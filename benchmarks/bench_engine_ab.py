"""The sampler at HEAD against the sampler of an earlier commit, on fixed-length generation.

    python benchmarks/bench_engine_ab.py [--ref 8ca037a] [--batch 8 32] [--prompt 32] [--new 128]
        [--repeats 5]

`--ref`'s `marljax` package is taken from this repository's history (`git archive`) into a
temporary directory and imported as `marljax_ref` (its own imports rewritten), so both
samplers run in one process, their calls alternating (A B A B ...) under the same load. The
default reference, 8ca037a, is the last commit with the static engine (one batch in lockstep,
left-padded prompts, one cache write index). Same checkpoint, prompts and settings as
`bench_generate.py`'s fixed-length rows (every row generates exactly `--new` tokens, EOS off);
the tokens of the two are compared as a check. Reports tokens/s by wall time and by CPU time
(all threads of this process), best of `--repeats` after a warm-up call.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def import_reference(ref: str, into: Path):
    """`marljax` at commit `ref` as the package `marljax_ref`."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "marljax"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "marljax").rename(into / "marljax_ref")
    for path in (into / "marljax_ref").rglob("*.py"):
        text = path.read_text()
        path.write_text(
            re.sub(r"\bmarljax\.", "marljax_ref.", re.sub(r"\bimport marljax\b", "import marljax_ref", text))
        )
    sys.path.insert(0, str(into))
    import importlib

    ref = importlib.import_module("marljax_ref")
    for sub in ("models", "sampler"):
        importlib.import_module(f"marljax_ref.{sub}")
    return ref


def main(argv=None) -> int:
    import bench_generate as bg
    import numpy as np
    from bench_common import interleaved

    from marljax.models import from_pretrained
    from marljax.sampler import SamplingParams, generate

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ref", default="8ca037a")
    p.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    path = bg.make_checkpoint(Path(bg.DEFAULT_CKPT))
    with tempfile.TemporaryDirectory(prefix="marljax-ref-") as tmp:
        ref = import_reference(args.ref, Path(tmp))
        head_model, _ = from_pretrained(path)
        ref_model, _ = ref.models.from_pretrained(path)
        print(f"fixed-length generation, HEAD vs {args.ref}: prompt {args.prompt}, {args.new} new tokens")
        print(
            "| batch | sampling | HEAD tokens/s | ref tokens/s | HEAD/ref (wall) | HEAD/ref (CPU) | tokens equal |"
        )
        print("|---|---|---|---|---|---|---|")
        for batch in args.batch:
            ids = bg.prompts(batch, args.prompt)
            for mode, kw in bg.SETTINGS.items():
                common = dict(max_new_tokens=args.new, eos_ids=(), seed=0, **kw)
                res = interleaved(
                    {
                        "head": lambda ids=ids, kw=kw: generate(
                            head_model, ids, SamplingParams(args.new, **kw), eos_ids=(), seed=0
                        ),
                        "ref": lambda ids=ids, common=common: ref.sampler.generate(ref_model, ids, **common),
                    },
                    args.repeats,
                )
                n = batch * args.new
                h, r = res["head"], res["ref"]
                same = float(np.mean(h["last"].tokens == r["last"].tokens))
                print(
                    f"| {batch} | {mode} | {n / h['best_seconds']:,.0f} | {n / r['best_seconds']:,.0f} | "
                    f"{r['best_seconds'] / h['best_seconds']:.2f}x | "
                    f"{r['best_cpu_seconds'] / h['best_cpu_seconds']:.2f}x | {same:.3f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
