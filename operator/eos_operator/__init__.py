"""The ExactlyOnceStream operator.

Layers, from pure to effectful (a module imports only from layers above it):

- ``eos_job.spec`` – the resource models (shared with the job runtime);
- ``conditions``, ``restart``, ``children``, ``validation``, ``observed`` – pure helpers;
- ``planner`` – ``plan(spec, status, observed) -> Plan``, the whole decision, pure;
- ``adapters`` – narrow interfaces to Kubernetes, resolution (Kafka) and the clock;
- ``reconciler`` – observe → validate → plan → write status → act, over the adapters;
- ``handlers`` – thin kopf registrations; ``cli`` – ``python -m eos_operator run``.
"""

__version__ = "0.1.0"
