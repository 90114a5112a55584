"""The external-agent fixtures (the synthetic task, aideml's cached environment, spec files derived from aideml's),
shared with the relay tests that plant attacks from inside a real sandbox through the real external-agent path."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_rexmle_external_fixtures",
                                               Path(__file__).parent.parent / "external" / "conftest.py")
assert _spec is not None and _spec.loader is not None  # a file next to this one
_external = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_external)

TASK = _external.TASK
data_root = _external.data_root
aideml_env = _external.aideml_env
spec_file = _external.spec_file
