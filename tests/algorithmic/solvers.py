"""Independent solvers for the algorithmic tasks, written from the task definitions without the
package's helpers: they read an example's token strings and recompute what it must be scored on."""
from __future__ import annotations


def parity(bits: list[str]) -> str:
    return str(sum(b == "1" for b in bits) % 2)


def perm_from_one_line(s: str) -> list[int]:
    """'20134' -> [2, 0, 1, 3, 4]: the map k -> int(s[k])."""
    return [int(c) for c in s]


def s5_states(inputs: list[str]) -> list[str]:
    """The state after each input, state_t(k) = g_t(state_{t-1}(k)), composed by hand."""
    state = [0, 1, 2, 3, 4]
    out = []
    for s in inputs:
        g = perm_from_one_line(s)
        state = [g[state[k]] for k in range(5)]
        out.append("".join(str(x) for x in state))
    return out


def mod5_value(symbols: list[str]) -> str:
    """Shunting-yard evaluation with unary minus, '*' before binary '+'/'-', left-associative."""
    prec = {"+": 1, "-": 1, "*": 2, "neg": 3}
    values: list[int] = []
    ops: list[str] = []

    def reduce_top():
        op = ops.pop()
        if op == "neg":
            values.append(-values.pop())
            return
        b, a = values.pop(), values.pop()
        values.append(a + b if op == "+" else a - b if op == "-" else a * b)

    expect_operand = True
    for s in symbols:
        if s.isdigit():
            values.append(int(s))
            expect_operand = False
        elif s == "(":
            ops.append(s)
        elif s == ")":
            while ops[-1] != "(":
                reduce_top()
            ops.pop()
        elif s == "-" and expect_operand:
            ops.append("neg")          # prefix operator: nothing to its left binds to it yet
        else:
            while ops and ops[-1] != "(" and prec[ops[-1]] >= prec[s]:
                reduce_top()
            ops.append(s)
            expect_operand = True
    while ops:
        reduce_top()
    (value,) = values
    return str(value % 5)


def addition_answer(prompt: str) -> str:
    """'[a_rev] + [b_rev] =' -> ' [c_rev]' with Python's integers."""
    left, right = prompt.rstrip("=").strip().split(" + ")
    a, b = int(left.strip("[]")[::-1]), int(right.strip("[]")[::-1])
    return " [" + str(a + b)[::-1] + "]"
