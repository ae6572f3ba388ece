"""The stream planner: ``plan(spec, status, observed) -> Plan``, pure (see dispatch.py for the states)."""
from .dispatch import ReconciliationState, plan, reconciliation_state
from .housekeeping import retention
from .launch import launch_config, plan_deletion, record_refusal, record_resolution
from .restarts import record_resolution_failure
from .step import POLL_SECONDS, SNAPSHOT_HISTORY
from .upgrade import overlay_spec

__all__ = ["POLL_SECONDS", "SNAPSHOT_HISTORY", "ReconciliationState", "launch_config", "overlay_spec", "plan",
           "plan_deletion", "reconciliation_state", "record_refusal", "record_resolution", "record_resolution_failure", "retention"]
