"""The build every test of an upgrade from the previous build starts from: the operator-upgrade e2e
(``tests/e2e/test_operator_upgrade_e2e.py``) and the operator's reading of the spec that build recorded
(``tests/operator/test_version_skew.py``). The last commit that landed (CI passed on it: stop 36 of
2026-11-28) until a release is tagged; ``make release`` says to set it to the new tag. The tests take it from
git (``git archive``), so they need the clone's history."""

PREVIOUS_BUILD = "a4d14b56fcac2045e6c37e83abf9de173e7e69d7"
