"""The one CSV writer of the tables rexmle makes for people (reports, analysis tables, tidy exports): no cell can
start a spreadsheet formula.

Much of what these tables hold was written by an agent (plans, reviews, evidence quotes, error messages, labels).
A text cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is taken by Excel, LibreOffice
and Google Sheets as a formula (``=HYPERLINK(...)`` leaks data, ``=cmd|...`` runs programs), so such a cell is
written with a leading single quote, as OWASP's CSV-injection advice says: the spreadsheet shows the text, and
runs nothing. Numbers stay numbers: a negative float is not text, nor is a text cell that is a plain decimal
number (``-1.5``, ``+2e-3``: no spreadsheet reads one as a formula).

Not for data contracts that machines read back (a submission, the sample submission, split manifests, answers):
a leading quote would change their values. Those keep the ``csv`` module.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def safe_cell(value: Any) -> Any:
    """``value`` unchanged unless it is text a spreadsheet would run as a formula; then quoted (``'=...``)."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS) and not _PLAIN_NUMBER.fullmatch(value):
        return "'" + value
    return value


def safe_row(row: Iterable[Any]) -> list[Any]:
    return [safe_cell(value) for value in row]


class SafeWriter:
    """``csv.writer`` with every cell through :func:`safe_cell`."""

    def __init__(self, handle: IO[str], **options: Any) -> None:
        self._writer = csv.writer(handle, **options)

    def writerow(self, row: Iterable[Any]) -> Any:
        return self._writer.writerow(safe_row(row))

    def writerows(self, rows: Iterable[Iterable[Any]]) -> None:
        for row in rows:
            self.writerow(row)


class SafeDictWriter(csv.DictWriter):  # type: ignore[type-arg]
    """``csv.DictWriter`` with every cell (and the header, which ``writeheader`` writes as a row) made safe."""

    def writerow(self, rowdict: Mapping[str, Any]) -> Any:
        return super().writerow({key: safe_cell(value) for key, value in rowdict.items()})

    def writerows(self, rowdicts: Iterable[Mapping[str, Any]]) -> None:
        for row in rowdicts:
            self.writerow(row)


def safe_frame(frame: Any) -> Any:
    """A copy of a pandas DataFrame whose text cells and column names are safe; numeric, boolean and time columns
    are left as they are (a column of negative floats is not text)."""
    import pandas as pd

    out = frame.copy()
    for column in out.columns:
        series = out[column]
        dtype = series.dtype
        if (pd.api.types.is_numeric_dtype(dtype) or pd.api.types.is_bool_dtype(dtype)
                or pd.api.types.is_datetime64_any_dtype(dtype) or pd.api.types.is_timedelta64_dtype(dtype)):
            continue
        out[column] = series.astype(object).map(safe_cell)
    out.columns = [safe_cell(name) for name in out.columns]
    return out


def frame_to_csv(frame: Any, path: Path | None = None) -> str | None:
    """``frame.to_csv(path, index=False)`` after :func:`safe_frame`: the CSV text when ``path`` is None."""
    return safe_frame(frame).to_csv(path, index=False)
