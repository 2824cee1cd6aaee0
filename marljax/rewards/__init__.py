"""Verifiers: sandboxed code execution and math answers, and the `Problem` they check.

Pure Python + stdlib (sympy optional); independent of JAX and of the models.

    from marljax.rewards import SandboxPool, humaneval_program, extract_code, error_feedback
    with SandboxPool() as pool:
        results = pool.map([humaneval_program(p, extract_code(text).code) for p, text in batch])
    rewards = [r.pass_fraction() for r in results]
    prompts = [error_feedback(r) for r in results if not r.passed]   # refinement steps only
"""

from .extract import ExtractedCode, extract_code
from .feedback import error_feedback, public_feedback
from .formats import (
    AssertTest,
    CallTest,
    Program,
    StdioTest,
    compare_stdout,
    compare_value,
    humaneval_program,
    io_program,
    load_humaneval,
    mbpp_program,
)
from .math_verify import extract_answer, is_equivalent, math_reward, normalize_answer
from .pool import SandboxPool, run_many
from .problems import Problem
from .results import ExecutionResult, Isolation, Status, TestResult
from .sandbox import LEVELS, Limits, SandboxConfig, detect_isolation, run_program
from .verifier import SandboxVerifier, Score, Verifier, score_texts

__all__ = [
    "AssertTest",
    "CallTest",
    "ExecutionResult",
    "ExtractedCode",
    "Isolation",
    "LEVELS",
    "Limits",
    "Problem",
    "Program",
    "SandboxConfig",
    "SandboxPool",
    "SandboxVerifier",
    "Score",
    "Status",
    "StdioTest",
    "TestResult",
    "Verifier",
    "compare_stdout",
    "compare_value",
    "detect_isolation",
    "error_feedback",
    "extract_answer",
    "extract_code",
    "humaneval_program",
    "io_program",
    "is_equivalent",
    "load_humaneval",
    "math_reward",
    "mbpp_program",
    "normalize_answer",
    "public_feedback",
    "run_many",
    "run_program",
    "score_texts",
]
