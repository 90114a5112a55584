"""Text that comes from agents and submissions, made safe to print.

A file name, an id in ``submission.csv``, the tail of an agent's output or an error message quoting them is data,
never an instruction to the operator's terminal: control characters (an ANSI escape sequence can rewrite the
screen, set the window title, or hide lines; a carriage return overwrites the line before it) and the Unicode
controls that reorder or hide text (bidirectional overrides, zero-width joiners are kept) are shown escaped.
Newlines and tabs are kept unless ``one_line`` asks for a single line.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, line/paragraph separators, bidirectional embeddings,
# overrides and isolates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_ONE_LINE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code == 0x0A:
        return "\\n"
    if code == 0x09:
        return "\\t"
    if code == 0x0D:
        return "\\r"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: object, *, one_line: bool = False) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``); newlines and tabs kept unless
    ``one_line``."""
    return (_UNSAFE_ONE_LINE if one_line else _UNSAFE).sub(_escape, str(text))
