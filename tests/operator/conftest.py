"""Unit tests of the operator: pure planning, models, builders and the reconciler over fakes. No server."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Importable without an editable install: the operator lives in operator/ (never as `operator`).
for extra in (REPO / "operator", REPO / "jobs"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))
