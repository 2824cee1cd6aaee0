"""Math answers: extraction (``\\boxed{}``, last number) and equivalence.

Equivalence is exact: both sides are normalised (LaTeX wrappers, ``$``,
thousands separators, ``\\frac``, trailing units of ``\\text{}``) and compared
as rationals (integers, decimals, fractions, mixed signs).  When sympy is
installed, symbolic answers (``2\\sqrt{2}``, ``\\pi/2``, ``x^2+1``) are
compared by ``simplify(a - b) == 0`` on a whitelisted expression; sympy is
never fed arbitrary text (``sympify`` evaluates Python).
"""

from __future__ import annotations

import importlib.util
import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|-?\.\d+")


def _boxed_contents(text: str) -> list[str]:
    out = []
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            out.append(text[m.end() : i - 1])
    return out


def extract_answer(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces ok), else the last number, else None."""
    text = text or ""
    boxed = _boxed_contents(text)
    if boxed:
        return boxed[-1].strip()
    nums = _NUMBER.findall(text)
    return nums[-1].replace(",", "") if nums else None


def _strip_braces(s: str) -> str:
    while s.startswith("{") and s.endswith("}"):
        depth = 0
        for k, ch in enumerate(s):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            if depth == 0 and k < len(s) - 1:
                return s
        s = s[1:-1].strip()
    return s


def normalize_answer(ans: str) -> str:
    """Canonical text of an answer (LaTeX noise removed)."""
    s = str(ans).strip()
    s = s.strip("$").strip()
    s = re.sub(r"\\text\{\s*([^{}]*)\}", r"\1", s)
    s = re.sub(r"\\(?:mathrm|textbf|mathbf)\{([^{}]*)\}", r"\1", s)
    s = s.replace("\\left", "").replace("\\right", "").replace("\\!", "").replace("\\,", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = re.sub(r"^(?:x|y|n|k|a|answer)\s*=\s*", "", s, flags=re.I)
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("°", "")
    s = re.sub(r"\s+", " ", s).strip().rstrip(".")
    s = _strip_braces(s)
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    return s


def _to_fraction(s: str) -> Fraction | None:
    s = s.replace(" ", "")
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+(?:\.\d+)?)\}\{(-?\d+(?:\.\d+)?)\}", s) or re.fullmatch(
        r"(-?)\\frac(\d)(\d)", s
    )
    try:
        if m:
            val = Fraction(m.group(2)) / Fraction(m.group(3))
            return -val if m.group(1) else val
        m = re.fullmatch(r"(-?\d+(?:\.\d+)?)/(-?\d+(?:\.\d+)?)", s)
        if m:
            return Fraction(m.group(1)) / Fraction(m.group(2))
        if re.fullmatch(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?", s):
            return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None
    return None


_SYMPY_OK = re.compile(r"^[0-9a-zA-Z+\-*/^().,\s]*$")
_SYMPY_NAMES = {"sqrt", "pi", "E", "I", "sin", "cos", "tan", "log", "exp"}


def _to_sympy(s: str):
    if importlib.util.find_spec("sympy") is None:
        return None
    t = s
    for _ in range(5):  # \frac{a}{b} -> (a)/(b), innermost first
        t2 = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", t)
        t2 = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", t2)
        if t2 == t:
            break
        t = t2
    t = (
        t.replace("\\pi", "pi")
        .replace("\\cdot", "*")
        .replace("\\times", "*")
        .replace("{", "(")
        .replace("}", ")")
    )
    t = re.sub(r"\\(sin|cos|tan|log|exp)", r"\1", t)
    if "\\" in t or "__" in t or not _SYMPY_OK.match(t) or len(t) > 200:
        return None
    for name in re.findall(r"[A-Za-z_]\w*", t):
        if len(name) > 1 and name not in _SYMPY_NAMES:
            return None
    try:
        from sympy.parsing.sympy_parser import (
            convert_xor,
            implicit_multiplication_application,
            parse_expr,
            standard_transformations,
        )

        return parse_expr(
            t,
            transformations=standard_transformations + (implicit_multiplication_application, convert_xor),
            evaluate=True,
        )
    except Exception:  # noqa: BLE001 - anything unparsable is simply not comparable
        return None


def is_equivalent(a: str, b: str) -> bool:
    """True when the two answers denote the same value (exact; sympy for symbolic forms)."""
    if a is None or b is None:
        return False
    na, nb = normalize_answer(a), normalize_answer(b)
    if na == nb:
        return True
    fa, fb = _to_fraction(na), _to_fraction(nb)
    if fa is not None and fb is not None:
        return fa == fb
    if (fa is None) != (fb is None) and (re.search(r"[a-zA-Z\\]", na + nb) is None):
        return False  # one numeric, one non-numeric text: not equal
    ea, eb = _to_sympy(na), _to_sympy(nb)
    if ea is None or eb is None:
        return False
    try:
        import sympy

        diff = sympy.simplify(ea - eb)
        return bool(diff == 0)
    except Exception:  # noqa: BLE001
        return False


def math_reward(response: str, reference: str) -> float:
    """1.0 when the answer extracted from ``response`` is equivalent to ``reference``, else 0.0."""
    ans = extract_answer(response)
    return 1.0 if ans is not None and is_equivalent(ans, reference) else 0.0
