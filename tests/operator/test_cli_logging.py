"""The operator's log levels: a handler that only waits is not an ERROR."""
from __future__ import annotations

import logging

from eos_operator.cli import WaitingIsNotAnError


def test_waiting_retries_are_logged_at_info_and_real_errors_stay_errors(caplog):
    log = logging.getLogger("kopf.objects.test-waiting")
    log.addFilter(WaitingIsNotAnError())
    with caplog.at_level(logging.INFO, logger=log.name):
        log.error("Handler 'stop' failed temporarily: ns/colors is being deleted: waiting for its driver to stop "
                  "at a clean batch boundary (not an error)")
        log.error("Handler 'reconcile-on-create' failed temporarily: connection refused")
    assert [(r.levelname, "not an error" in r.getMessage()) for r in caplog.records] == [
        ("INFO", True), ("ERROR", False)]
