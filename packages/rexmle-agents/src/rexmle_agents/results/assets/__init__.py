"""The inlined page of ``rexmle view``: its template, style sheet and script (package data)."""
