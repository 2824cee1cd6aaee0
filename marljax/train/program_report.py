"""What one compiled program needs per device (`marljax compile`, `marljax.train.aot`).

XLA's `memory_analysis()` gives a compiled program's arguments, outputs, donated (aliased) buffers
and temporaries; its `cost_analysis()` its FLOPs; its HLO text the collectives it runs. A
`ProgramReport` holds them beside the policy's estimate (`marljax.train.memory`) and the state the
program does not take but that stays resident meanwhile, which together give its peak and whether
it fits the device; `format_report` prints one in a few lines.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

from marljax.train import memory

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_COLLECTIVE_LINE = re.compile(
    r"=\s*(?P<type>.+?)\s+(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\("
)
_SHAPE = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\]")


@dataclasses.dataclass
class Collective:
    op: str  # e.g. "all-reduce"
    shape: str  # e.g. "bf16[16,1024,896]"
    count: int

    def dims(self) -> tuple[int, ...]:
        inside = self.shape[self.shape.index("[") + 1 : -1]
        return tuple(int(d) for d in inside.split(",") if d)


@dataclasses.dataclass
class ProgramReport:
    """One compiled program's per-device figures."""

    policy: str
    program: str
    arguments: int
    outputs: int
    aliased: int  # output bytes that reuse donated argument buffers
    temporaries: int
    flops: float
    collectives: Sequence[Collective]
    resident_elsewhere: int  # the policy's state the program does not take, resident meanwhile
    estimate: int  # memory.py's figure for what the temporaries hold
    estimate_what: str
    limit: int | None  # the device's memory, where known
    seconds: float = 0.0  # lowering and compiling
    error: str | None = None  # the compiler's own out-of-memory message (then no figures)

    @property
    def peak(self) -> int:
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.resident_elsewhere

    @property
    def fits(self) -> bool:
        return self.error is None and (self.limit is None or self.peak <= self.limit)


def collectives(hlo: str) -> list[Collective]:
    """The collective ops of compiled HLO text, by op and result shape, with their counts (ops in
    a loop body count once)."""
    counts: dict[tuple[str, str], int] = {}
    for line in hlo.splitlines():
        m = _COLLECTIVE_LINE.search(line)
        if m is None:
            continue
        shapes = [f"{t}[{d}]" for t, d in _SHAPE.findall(m["type"])]
        if m["start"] and len(shapes) > 1:  # async start: (operands..., results...): the results
            shapes = shapes[len(shapes) // 2 :]
        for s in shapes:
            counts[(m["op"], s)] = counts.get((m["op"], s), 0) + 1
    return [Collective(op, s, n) for (op, s), n in sorted(counts.items())]


def activation_shaped(c: Collective, rows: int, seq: int) -> bool:
    """Whether `c` carries a whole micro-batch's activations: a floating-point all-reduce whose
    shape has the micro-batch's `rows` followed by a sequence dimension (`seq` or a logit chunk).
    (Integer arrays such as token ids are not activations.)"""
    dims = c.dims()
    lengths = {seq, min(seq, memory.LOGIT_CHUNK)}
    return (
        c.op == "all-reduce"
        and c.shape.startswith(("bf16", "f16", "f32"))
        and any(a == rows and b in lengths for a, b in zip(dims, dims[1:], strict=False))
    )


def analyse(compiled) -> dict:
    """A `jax.stages.Compiled` program's figures, as `ProgramReport`'s fields."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(
        arguments=int(mem.argument_size_in_bytes),
        outputs=int(mem.output_size_in_bytes),
        aliased=int(mem.alias_size_in_bytes),
        temporaries=int(mem.temp_size_in_bytes),
        flops=float((cost or {}).get("flops", float("nan"))),
        collectives=collectives(compiled.as_text()),
    )


# the figures of a program the compiler refused
NO_FIGURES = dict(arguments=0, outputs=0, aliased=0, temporaries=0, flops=float("nan"), collectives=())


def _b(n: float) -> str:
    return memory._bytes(n)


def format_report(r: ProgramReport, rows: int | None = None, seq: int | None = None) -> str:
    """A few lines for one program: memory per device beside the estimate, FLOPs, collectives."""
    if r.error is not None:
        return (
            f"policy {r.policy!r} {r.program}: DOES NOT FIT: the compiler refused it: {r.error}\n"
            f"  estimate {_b(r.estimate)} ({r.estimate_what})"
        )
    verdict = "no device memory figure" if r.limit is None else ("fits" if r.fits else "DOES NOT FIT")
    device = "" if r.limit is None else f" of {_b(r.limit)}"
    lines = [
        f"policy {r.policy!r} {r.program}: per device arguments {_b(r.arguments)}, outputs {_b(r.outputs)}"
        f" ({_b(r.aliased)} donated), temporaries {_b(r.temporaries)}; estimate {_b(r.estimate)} "
        f"({r.estimate_what})",
        f"  peak {_b(r.peak)} (with {_b(r.resident_elsewhere)} of resident state it does not take)"
        f"{device}: {verdict}; {r.flops / 1e12:.3g} TFLOP; compiled in {r.seconds:.0f} s",
    ]
    if r.collectives:
        parts = []
        for c in r.collectives:
            flag = " ACTIVATION-SHAPED" if rows and seq and activation_shaped(c, rows, seq) else ""
            parts.append(f"{c.op} {c.shape} x{c.count}{flag}")
        lines.append("  collectives: " + ", ".join(parts))
    else:
        lines.append("  collectives: none")
    return "\n".join(lines)


__all__ = [
    "COLLECTIVES",
    "NO_FIGURES",
    "Collective",
    "ProgramReport",
    "activation_shaped",
    "analyse",
    "collectives",
    "format_report",
]
