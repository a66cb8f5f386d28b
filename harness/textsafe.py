"""Record text is data: it never becomes a path component, Markdown structure or code as it stands.

Records can hold anything an exception message or a package's metadata holds (`/`, `|`, `<img ...>`,
newlines, backslashes). Every writer that puts record text into a file name or a Markdown table goes
through these two functions.
"""

from __future__ import annotations

import html
import re

_UNSAFE_PATH = re.compile(r"[^A-Za-z0-9_.-]+")


def slug(text: object, limit: int = 48) -> str:
    """A safe file-name component: letters, digits, `_`, `.`, `-` only; never empty, never `.` or `..`."""
    cleaned = _UNSAFE_PATH.sub("_", str(text)).strip("._")[:limit]
    return cleaned or "x"


def md(text: object) -> str:
    """Text for one Markdown table cell: one line, `|` escaped, `<`, `>` and `&` as entities (GitHub renders
    raw HTML in Markdown)."""
    flat = " ".join(str(text if text is not None else "").split())
    return html.escape(flat, quote=False).replace("|", "\\|")


def code(text: object) -> str:
    """A Markdown code span for one table cell. Inside a code span nothing is markup (`<img>` shows as text,
    `->` stays readable), so only what could end the span or the cell is replaced: backticks and `|`."""
    flat = " ".join(str(text if text is not None else "").split()).replace("`", "'")
    return "`" + flat.replace("|", "\\|") + "`" if flat else ""


def one_line(text: object, limit: int = 400) -> str:
    """Text for one line of a terminal: whitespace and newlines folded, cut to `limit` characters (an error that
    quotes a user's 50 MB line prints its start, not the line)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
