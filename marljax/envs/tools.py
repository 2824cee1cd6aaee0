"""Tools agents call, and the box that runs them: every failure is an observation, never an exception.

A `Tool` is a name, a description, a JSON schema of its arguments and a Python function returning
text. `ToolBox.run` checks the call against the schema, runs the function with a time limit, and
cuts an over-long result, saying so. Built in: `python_tool` (code in the sandbox of
`marljax.rewards`), `calculator_tool` (arithmetic without `eval`) and `search_tool`
(`marljax.envs.search`).

    def lookup(word: str) -> str:
        return DICTIONARY.get(word, "not found")

    box = ToolBox([Tool("lookup", "Look a word up.", {"word": "string"}, lookup)])
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import operator
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from marljax.envs.tool_calls import ToolCall, tool_schema
from marljax.rewards import Limits, Program, Status, StdioTest, run_program

_JSON_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "object": dict,
    "array": list,
}


@dataclasses.dataclass(frozen=True)
class Tool:
    """A function the agents may call. `parameters`: either a JSON schema of an object, or the
    short form ``{argument: JSON type name}`` (every argument required)."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: Callable[..., Any]  # returns the observation: text, or an `Observation`
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        params = dict(self.parameters)
        if params.get("type") != "object":  # the short form
            bad = {k: v for k, v in params.items() if v not in _JSON_TYPES}
            if bad:
                raise ValueError(
                    f"tool {self.name!r}: argument types {bad} are not JSON type names {sorted(_JSON_TYPES)}"
                )
            params = {
                "type": "object",
                "properties": {k: {"type": v} for k, v in params.items()},
                "required": list(params),
            }
        object.__setattr__(self, "parameters", params)
        if not self.timeout_s > 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be > 0, got {self.timeout_s}")

    @property
    def schema(self) -> dict[str, Any]:
        return tool_schema(self.name, self.description, self.parameters)

    def argument_error(self, arguments: Mapping[str, Any]) -> str | None:
        """Why `arguments` do not fit the schema (missing, unknown or mistyped), or None."""
        props = self.parameters.get("properties", {})
        missing = [k for k in self.parameters.get("required", []) if k not in arguments]
        if missing:
            return f"missing argument(s) {missing}"
        unknown = [k for k in arguments if k not in props]
        if unknown:
            return f"unknown argument(s) {unknown}; known: {sorted(props)}"
        for key, value in arguments.items():
            want = props[key].get("type")
            if want not in _JSON_TYPES:
                continue
            # JSON keeps booleans apart from numbers; Python's bool is an int
            fits = isinstance(value, _JSON_TYPES[want]) and (want == "boolean" or not isinstance(value, bool))
            if not fits:
                return f"argument {key!r} must be of type {want}, got {value!r}"
        return None


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a tool's function may return instead of plain text: the `text` the agent reads and the
    `result` a reward may judge, e.g. what a program printed (None: the call produced none, such as
    a program that failed). A plain string is both."""

    text: str
    result: str | None


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """What a call gave: the observation text, its result (`Observation`; None for a failed call)
    and how it went (`error` is None on success: else one of unknown_tool, bad_arguments,
    exception, timeout)."""

    call: ToolCall
    text: str
    error: str | None = None
    truncated: bool = False
    result: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def truncate(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to `limit` characters with a note of how much was dropped."""
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"\n[observation truncated: {len(text) - limit} more characters]", True


class ToolBox:
    """Tools by name; `run` turns any call into a `ToolResult`."""

    def __init__(
        self, tools: Sequence[Tool], max_observation_chars: int = 2000, max_argument_chars: int = 100_000
    ):
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tools = {t.name: t for t in tools}
        self.max_observation_chars = max_observation_chars
        self.max_argument_chars = max_argument_chars

    @property
    def schemas(self) -> tuple[dict[str, Any], ...]:
        return tuple(t.schema for t in self.tools.values())

    def run(self, call: ToolCall) -> ToolResult:
        try:
            text, error, cut, result = self._run(call)
        except Exception as e:  # noqa: BLE001 - e.g. arguments too deep to print: still an observation
            text, error, cut, result = _failed(f"error: {call.name} failed: {type(e).__name__}", "exception")
        return ToolResult(call, clean_text(text), error, cut, result)

    def _run(self, call: ToolCall) -> tuple[str, str | None, bool, str | None]:
        tool = self.tools.get(call.name)
        if tool is None:
            known = ", ".join(self.tools) or "none"
            return _failed(f"error: unknown tool {call.name!r}; tools: {known}", "unknown_tool")
        size = len(json.dumps(call.arguments))
        if size > self.max_argument_chars:
            return _failed(
                f"error: {call.name}: arguments of {size} characters; at most {self.max_argument_chars}",
                "bad_arguments",
            )
        bad = tool.argument_error(call.arguments)
        if bad is not None:
            return _failed(
                truncate(f"error: {call.name}: {bad}", self.max_observation_chars)[0], "bad_arguments"
            )
        outcome = _call_with_timeout(tool.fn, call.arguments, tool.timeout_s)
        if outcome is None:
            return _failed(f"error: {call.name} timed out after {tool.timeout_s:g} s", "timeout")
        value, exc = outcome
        if exc is not None:
            message = truncate(f"{type(exc).__name__}: {_safe_str(exc)}", self.max_observation_chars)[0]
            return _failed(f"error: {call.name} failed: {message}", "exception")
        if isinstance(value, Observation):
            text, result = _safe_str(value.text), value.result
        else:
            text = result = _safe_str(value)
        text, cut = truncate(text, self.max_observation_chars)
        return text, None, cut, result


def _failed(text: str, error: str) -> tuple[str, str, bool, None]:
    """`ToolBox._run`'s answer for a call that failed: its error text (whole), the kind, no result."""
    return text, error, False, None


def _safe_str(value: Any) -> str:
    try:
        return str(value)
    except Exception as e:  # noqa: BLE001 - e.g. an int too long to print
        return f"<{type(value).__name__} that cannot be shown: {type(e).__name__}>"


# Chat markup a tool result must not carry into the next prompt as real control tokens:
# <|im_end|>, <|eot_id|>, <|python_tag|> ... and the tool-call tags.
_MARKUP = re.compile(r"<(\|[^<>|\s]{1,40}\||/?tool_call|/?tool_response|/?(?:start|end)_of_turn)>")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """`text` safe to show an agent: lone surrogates (from JSON escapes) become U+FFFD, and chat
    markup is broken up (``<|im_end|>`` -> ``< |im_end| >``) so a tokenizer reads it as plain text."""
    text = _SURROGATE.sub("\ufffd", text)
    return _MARKUP.sub(lambda m: f"< {m.group(1)} >", text)


def _call_with_timeout(fn: Callable[..., Any], arguments: Mapping[str, Any], timeout_s: float):
    """`(value, exception)` of `fn(**arguments)`, or None when it did not return within `timeout_s`.
    The call runs in a daemon thread: Python cannot stop a thread, so one that times out is left
    to finish in the background (tools that can hang on real work, such as `python`, bound it
    themselves in a killable process)."""
    box: list = []

    def target():
        try:
            box.append((fn(**arguments), None))
        except Exception as e:  # the tool's failure is the agent's observation
            box.append((None, e))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else None


# ------------------------------------------------------------------ built-in tools
def python_tool(limits: Limits | None = None, runner: Any = None) -> Tool:
    """`python(code)`: runs the code in the sandbox (`marljax.rewards`) and returns its verdict and its
    output (stdout and stderr together; for a program that fails, its error: the sandbox does not
    report what such a program printed). `runner`: a `Verifier` or anything with `run(programs)`
    (the trainer's sandbox pool); None starts one sandboxed process per call."""
    limits = limits or Limits(test_timeout_s=5.0, program_timeout_s=10.0)

    def python(code: str) -> Observation:
        program = Program(code=code, tests=(StdioTest("", ""),))
        result = runner.run([program])[0] if runner is not None else run_program(program, limits)
        test = result.tests[0] if result.tests else None
        out = (test.actual if test is not None else None) or result.output_tail or ""
        # the empty expected output makes any printing program a "wrong answer": it ran to the end
        if test is not None and test.status in (Status.PASSED, Status.WRONG_ANSWER):
            return Observation(f"verdict: ok\noutput:\n{out}", out)
        ran = test is not None and test.status is not Status.NOT_RUN
        status = test.status if ran else result.status  # e.g. a syntax error: no test ran
        if status is Status.TIMEOUT:
            return Observation(f"verdict: timeout (limit {limits.test_timeout_s:g} s)\noutput:\n{out}", None)
        kind = (test.exc_type if test is not None else None) or result.error_type or str(status)
        message = (test.message if test is not None else None) or result.error_message or ""
        return Observation(f"verdict: {status}\nerror: {kind}: {message}\noutput:\n{out}", None)

    return Tool(
        "python",
        "Run a Python program and see what it prints (stdout and stderr).",
        {"code": "string"},
        python,
        timeout_s=limits.program_timeout_s + 5.0,  # the sandbox enforces its own limits first
    )


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {"abs": abs, "round": round, "min": min, "max": max, "sqrt": math.sqrt}
_MAX_EXPONENT = 100
_MAX_MAGNITUDE = 1e100
_MAX_EXPRESSION_CHARS = 1000


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression: numbers, ``+ - * / // % **``, parentheses and
    abs / round / min / max / sqrt. Anything else (names, attributes, strings) is a ValueError, and
    so are exponents above 100, numbers and results above 1e100 in size (so ``9**9**9`` cannot hang)
    and expressions over 1000 characters."""

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            if not abs(node.value) <= _MAX_MAGNITUDE:  # also inf (1e309) and nan
                raise ValueError("a number is out of range (larger than 1e100 in size)")
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError(f"exponent {right} is larger than {_MAX_EXPONENT}")
            value = _BINARY[type(node.op)](left, right)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            value = _UNARY[type(node.op)](ev(node.operand))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _FUNCTIONS
            and not node.keywords
        ):
            value = _FUNCTIONS[node.func.id](*[ev(a) for a in node.args])
        else:
            raise ValueError(f"not allowed in a calculation: {ast.unparse(node)!r}")
        if isinstance(value, complex) or abs(value) > _MAX_MAGNITUDE:
            raise ValueError(f"result out of range: {ast.unparse(node)!r}")
        return value

    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an expression: {e.msg}") from None
    return ev(tree)


def calculator_tool(timeout_s: float = 2.0) -> Tool:
    """`calculator(expression)`: `calculate`'s value as text."""

    def calculator(expression: str) -> str:
        value = calculate(expression)
        return repr(int(value)) if isinstance(value, float) and value.is_integer() else repr(value)

    return Tool(
        "calculator",
        "Evaluate an arithmetic expression (+ - * / // % **, parentheses, abs, round, min, max, sqrt).",
        {"expression": "string"},
        calculator,
        timeout_s,
    )
