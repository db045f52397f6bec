"""Text from runs, configs and tokenizers inside the reports' Markdown tables.

A run name, a layout, a problem message or a decoded token may hold `|` or a line break: written into
a table row as is, it ends the cell (or the row) early and shifts every column after it. `cell`
writes a pipe as the entity `&#124;` (rendered as `|`, never read as a cell border, whatever the
renderer's backslash rules) and a line break as a space; `code` keeps inline code for ordinary names
and falls back to `cell` where a backtick, pipe or line break would break the code span."""
from __future__ import annotations

from typing import Any

PIPE = "&#124;"


def cell(value: Any) -> str:
    """str(value) (None: '-') safe as one table cell or one list item: pipes as &#124;, no line breaks."""
    text = "-" if value is None else str(value)
    return " ".join(text.replace("|", PIPE).splitlines())


def code(value: Any) -> str:
    """`value` as inline code, or cell(value) where it holds a backtick, a pipe or a line break."""
    text = "-" if value is None else str(value)
    if not text.strip() or any(c in text for c in "`|") or len(text.splitlines()) != 1:
        return cell(text)
    return f"`{text}`"
