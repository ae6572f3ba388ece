"""Unit tests of the operator: pure planning, models, builders and the reconciler over fakes. No server."""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Importable without an editable install: the operator lives in operator/ (never as `operator`).
for extra in (REPO / "operator", REPO / "jobs"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))


import pytest  # noqa: E402

from eos_operator.validation import allow_local_store  # noqa: E402

allow_local_store(True)   # module-level specs of the test files are validated at import


@pytest.fixture(autouse=True)
def local_store_allowed():
    """The fakes and the corpus keep checkpoints in a local directory, as the operator the e2e tests start
    allows (--allow-local-store); test_validation checks the refusal without it."""
    allow_local_store(True)
    yield
    allow_local_store(True)
