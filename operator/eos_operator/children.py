"""Pure builders of a stream's child objects: names, labels, the run ConfigMap,
the driver Pod, the headless driver Service and the spark-submit arguments.

Names are deterministic (``<name>-run``, ``<name>-driver-<n>``, ``<name>-driver``)
so a repeated create is a 409, never a second object, and every child carries
an owner reference to the stream so Kubernetes collects it with the stream.
"""
from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass
from typing import Any

from eos_job.driver_metrics import PORT_NAME as METRICS_PORT_NAME
from eos_job.spec import API_GROUP, API_VERSION, KIND, ExactlyOnceStreamSpec, RunConfig, StreamIdentity, stream_uid
from eos_job.kafka_security import env_name, secret_refs
from eos_job.memory import DRIVER_HEAP_ENV, driver_split_of, executor_spark_conf
from eos_job.log_format import ATTEMPT_ENV, FORMAT_ENV, current_format
from eos_job.spec_rules import POD_TEMPLATE_FILE_CONF, sets_runtime_env

MANAGED_BY = "eos-operator"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_STREAM = f"{API_GROUP}/stream"
LABEL_GENERATION = f"{API_GROUP}/generation"
LABEL_ATTEMPT = f"{API_GROUP}/attempt"
LABEL_DRIVER_METRICS = f"{API_GROUP}/driver-metrics"   # "true" on a driver serving job.metrics (the PodMonitor)
ANNOTATION_SPEC_HASH = f"{API_GROUP}/spec-hash"

RUN_CONFIG_KEY = "run.json"
HOSTNAME_LABEL = "kubernetes.io/hostname"
EXECUTOR_TEMPLATE_KEY = "executor-template.yaml"   # Spark's executor pod template (job.executor.podTemplate)
EXECUTOR_TEMPLATE_DIR = "/etc/eos"
RUN_CONFIG_ENV = "EOS_RUN_CONFIG"
# The job runtime reads the sink's SASL credentials from these variables; the
# Pod fills them from the Secrets named in spec.sink.credentials, so no secret
# value ever passes through the operator, the ConfigMap or the logs.
SNAPSHOT_ON_STOP_ENV = "EOS_SNAPSHOT_ON_STOP"   # read by eos_job.cli
DRIVER_CONTAINER = "driver"
# The driver's (and every helper Pod's) command line is the container's ``args``, not its ``command``: the image's
# entrypoint stays, tini as PID 1 and docker/entrypoint.sh, which runs its arguments as given. A ``command`` would
# make Python PID 1 of the container: it reaps no orphan (PySpark's workers), and a signal sent from inside the
# container (the fault hooks' driver kill) cannot kill PID 1 (seen on the real nodes: the JVM died, the driver
# lived on and exited 1). A job image must keep that entrypoint (built FROM the project's image it does).
DRIVER_COMMAND = ["python", "-m", "eos_job", "run", "--config-env", RUN_CONFIG_ENV]
TERMINATION_GRACE_SECONDS = 60
DRIVER_PORT = 7078
BLOCK_MANAGER_PORT = 7079
SPARK_MASTER_ENV = "EOS_SPARK_MASTER"   # "k8s": the runtime's master is the API server the Pod sees
POD_IP_ENV = "EOS_POD_IP"               # the driver's Pod IP (fieldRef status.podIP): its address without DRIVER_HOST_ENV
DRIVER_HOST_ENV = "EOS_DRIVER_HOST"     # the driver's address for its executors: its headless Service's DNS name
UI_BIND_ENV = "SPARK_LOCAL_IP"          # Spark's UI (and its metrics servlet) binds there (eos_job.driver_metrics)
UI_BIND_ALL = "0.0.0.0"                 # every address of the Pod: its IP and loopback
CHECKPOINT_VOLUME = "checkpoint"
LABEL_AUX = f"{API_GROUP}/aux"          # pre-flight and drain Pods (not drivers of the stream)
PREFLIGHT = "preflight"
DRAIN = "drain"
PROBE = "probe"                         # checkpoint.store pvc: reads the checkpoint on the claim before resolution
CHECK = "check"                         # ... and an upgrade's snapshot and checkpoint once the old driver is gone
LABEL_SNAPSHOT_ACTION = f"{API_GROUP}/snapshot-action"   # a snapshot's Pods: take, inspect or dispose
SNAPSHOT_CONTAINER = "snapshot"
# The container of every Pod the operator makes is named one of these (a Pod may also have sidecars).
OWN_CONTAINERS = (DRIVER_CONTAINER, PREFLIGHT, DRAIN, PROBE, CHECK, SNAPSHOT_CONTAINER)
AUX_COMPONENTS = (PREFLIGHT, DRAIN, PROBE, CHECK)


MAX_LABEL = 63                 # a label value, a Service name (DNS-1035 label)
MAX_STREAM_NAME = MAX_LABEL - len("-driver")   # the driver's Service is <stream>-driver (the CRD enforces it)


def fitted_name(base: str, suffix: str, limit: int = MAX_LABEL) -> str:
    """``base + suffix``, or when longer than ``limit``: ``base`` cut short plus a hash of the whole
    ``base``, so names stay distinct, stable and within ``limit`` (snapshot names are label values)."""
    name = base + suffix
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:6]
    keep = limit - len(suffix) - len(digest) - 1
    return f"{base[:keep].rstrip('-.')}-{digest}{suffix}"


def run_config_name(stream: str) -> str:
    return f"{stream}-run"


def driver_pod_name(stream: str, attempt: int) -> str:
    return f"{stream}-driver-{attempt}"


def driver_service_name(stream: str) -> str:
    return f"{stream}-driver"


def driver_service_host(ref: StreamRef) -> str:
    """The driver's name for its executors in cluster mode: ``<stream>-driver.<namespace>.svc``, the headless
    Service's (``driver_service``), which cluster DNS answers with the running driver Pod's IP."""
    return f"{driver_service_name(ref.name)}.{ref.namespace}.svc"


def aux_pod_name(stream: str, component: str, attempt: int) -> str:
    """``<stream>-preflight-<n>`` / ``<stream>-drain-<n>`` / ``<stream>-probe-<n>``: one per launch attempt."""
    return f"{stream}-{component}-{attempt}"


def aux_config_name(stream: str, component: str) -> str:
    return f"{stream}-{component}"


def aux_selector(stream: str) -> dict[str, str]:
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STREAM: stream, LABEL_AUX: "true"}


def preflight_scratch_dir(spec: ExactlyOnceStreamSpec, attempt: int) -> str:
    return spec.checkpoint.root() + f"/preflight-{attempt}"


def checkpoint_dir(spec: ExactlyOnceStreamSpec) -> str:
    """The first checkpoint location of a stream; upgrades move it to ``ckpt-<uid>-<n>``."""
    return spec.checkpoint.root() + "/live"


def upgrade_checkpoint_dir(spec: ExactlyOnceStreamSpec, uid: str, attempt: int) -> str:
    """The new checkpoint location of a snapshot or stateless upgrade started as driver ``attempt``. The uid part
    keeps a re-created stream of the same name (whose attempts count from 0 again) off the locations of the
    stream it replaces: a driver seeds a location from a snapshot only while it holds no checkpoint."""
    return spec.checkpoint.root() + f"/ckpt-{uid[:8]}-{attempt}"


def snapshot_name(ref: "StreamRef", attempt: int) -> str:
    """Per driver attempt; the uid part keeps a recreated stream of the same name off old snapshots."""
    return fitted_name(ref.name, f"-{ref.uid[:8]}-a{attempt}")


def snapshot_path(ref: "StreamRef", spec: ExactlyOnceStreamSpec, attempt: int) -> str:
    """Where driver ``attempt`` writes its snapshot when stopped gracefully."""
    return spec.checkpoint.root() + f"/snapshots/{snapshot_name(ref, attempt)}"


@dataclass(frozen=True)
class StreamRef:
    """The owning stream, as child objects need it."""
    name: str
    namespace: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": KIND, "name": self.name,
                "uid": self.uid, "controller": True, "blockOwnerDeletion": True}


def stream_selector(stream: str) -> dict[str, str]:
    """Labels that select every driver Pod of the stream, whatever its attempt."""
    return {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STREAM: stream, LABEL_COMPONENT: "driver"}


def selector_string(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def run_config(ref: StreamRef, spec: ExactlyOnceStreamSpec, tx_generation: int, *,
               checkpoint: str | None = None, restore_from: str | None = None,
               replay_offsets_from: str | None = None) -> RunConfig:
    return RunConfig(stream=StreamIdentity(name=ref.name, namespace=ref.namespace,
                                           uid=stream_uid(ref.namespace, ref.name),
                                           generation=tx_generation),
                     spec=spec, checkpoint_dir=checkpoint or checkpoint_dir(spec), restore_from=restore_from,
                     replay_offsets_from=replay_offsets_from)


def _meta(ref: StreamRef, name: str, labels: dict[str, str],
          annotations: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ref.namespace, "labels": labels,
                            "ownerReferences": [ref.owner_reference()]}
    if annotations:
        meta["annotations"] = annotations
    return meta


def run_config_map(ref: StreamRef, config: RunConfig, name: str | None = None) -> dict[str, Any]:
    labels = {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STREAM: ref.name,
              LABEL_GENERATION: str(config.stream.generation)}
    # Unset optional fields are left out (Model.wire), not written as nulls: a runtime one minor version older
    # (docs/api-policy.md) refuses unknown fields, and would otherwise refuse every field added since it, used or not.
    # job.metrics.uiService is the operator's alone (eos_operator.spark_ui): left out, so an older runtime runs it too.
    wire = config.wire()
    (wire["spec"]["job"].get("metrics") or {}).pop("uiService", None)
    # sink.writer python is what a runtime before the field runs anyway: left out unless jvm.
    if wire["spec"]["sink"].get("writer") == "python":
        del wire["spec"]["sink"]["writer"]
    data = {RUN_CONFIG_KEY: json.dumps(wire)}
    if config.spec.job.deploy_mode == "cluster":
        template = config.spec.job.executor.pod_template.executor_template()
        data[EXECUTOR_TEMPLATE_KEY] = json.dumps(template, sort_keys=True)   # JSON is YAML
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(ref, name or run_config_name(ref.name), labels,
                              {ANNOTATION_SPEC_HASH: config.spec.spec_hash()}),
            "data": data}


def spark_submit_args(ref: StreamRef, spec: ExactlyOnceStreamSpec, pod_name: str) -> list[str]:
    """spark-submit arguments for deployMode=cluster: this Pod is the (client-mode) driver,
    Spark's Kubernetes scheduler creates the executors, owned by the driver Pod so they
    die with it. The master (the API server, as an in-cluster Pod reaches it) and the driver's
    address are set by the runtime's session (``eos_job.session``, from KUBERNETES_SERVICE_HOST/PORT, known only
    inside the Pod, and EOS_DRIVER_HOST, the driver Service's name, else EOS_POD_IP)."""
    job = spec.job
    conf = {
        "spark.kubernetes.namespace": ref.namespace,
        "spark.kubernetes.container.image": job.image,
        "spark.kubernetes.driver.pod.name": pod_name,
        "spark.kubernetes.executor.podNamePrefix": pod_name,
        f"spark.kubernetes.executor.label.{LABEL_MANAGED_BY}": MANAGED_BY,
        f"spark.kubernetes.executor.label.{LABEL_STREAM}": ref.name,
        f"spark.kubernetes.executor.label.{LABEL_COMPONENT}": "executor",
        "spark.driver.bindAddress": "0.0.0.0",
        "spark.driver.port": str(DRIVER_PORT),
        "spark.driver.blockManager.port": str(BLOCK_MANAGER_PORT),
        "spark.executor.instances": str(job.executor.instances),
        # The containers' splits (eos_job.memory): the executor Pod's limit, heap plus overhead, is
        # job.executor.memory; the driver's heap leaves room in job.driver.memory for the rest.
        **executor_spark_conf(spec),
        "spark.driver.memory": driver_split_of(spec).spark_heap,
        "spark.kubernetes.executor.request.cores": job.executor.cpu,
        "spark.kubernetes.executor.limit.cores": job.executor.cpu,
        "spark.sql.shuffle.partitions": str(job.parallelism),
    }
    if job.service_account_name:
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] = job.service_account_name
    ck = spec.checkpoint
    if ck.store == "s3" and ck.s3 is not None and ck.s3.access_key_id and ck.s3.secret_access_key:
        # Executors write state files to the checkpoint: the same keys, from the same Secret.
        for var, ref_ in (("AWS_ACCESS_KEY_ID", ck.s3.access_key_id), ("AWS_SECRET_ACCESS_KEY", ck.s3.secret_access_key)):
            conf[f"spark.kubernetes.executor.secretKeyRef.{var}"] = f"{ref_.name}:{ref_.key}"
    conf.update(job.executor.pod_template.spark_conf())
    conf["spark.kubernetes.executor.podTemplateFile"] = f"{EXECUTOR_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_KEY}"
    if ck.store == "pvc" and ck.claim_name:
        # The state store's files live under the checkpoint: executors mount the same claim at the same path.
        vol = "spark.kubernetes.executor.volumes.persistentVolumeClaim.checkpoint"
        conf[f"{vol}.options.claimName"] = ck.claim_name
        conf[f"{vol}.mount.path"] = ck.path
        conf[f"{vol}.mount.readOnly"] = "false"   # they write to it (Spark's default, said so)
    # The user's sparkConf wins, except for what pins this driver's identity, the Pod template files and the
    # runtime's EOS_* variables (refused by validation; never passed on, even from a spec that skipped it).
    pinned = {"spark.kubernetes.driver.pod.name", "spark.kubernetes.namespace", "spark.driver.host",
              *POD_TEMPLATE_FILE_CONF}
    for key, value in sorted(job.spark_conf.items()):
        if key not in pinned and not sets_runtime_env(key):
            conf[key] = value
    args = ["--deploy-mode", "client", "--name", ref.name]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return args


def driver_pod(ref: StreamRef, spec: ExactlyOnceStreamSpec, *, attempt: int, tx_generation: int,
               snapshot_on_stop: str | None = None) -> dict[str, Any]:
    name = driver_pod_name(ref.name, attempt)
    labels = {**stream_selector(ref.name), LABEL_GENERATION: str(tx_generation), LABEL_ATTEMPT: str(attempt)}
    metrics = spec.job.metrics if spec.job.metrics is not None and spec.job.metrics.enabled else None
    if metrics is not None:
        labels[LABEL_DRIVER_METRICS] = "true"
    env: list[dict[str, Any]] = [
        {"name": RUN_CONFIG_ENV,
         "valueFrom": {"configMapKeyRef": {"name": run_config_name(ref.name), "key": RUN_CONFIG_KEY}}},
        {"name": "EOS_DRIVER_POD", "value": name},
        {"name": ATTEMPT_ENV, "value": str(attempt)},   # a field of the runtime's JSON log lines
    ]
    if snapshot_on_stop:
        # The runtime's --snapshot-on-stop default: any graceful stop of this driver leaves a snapshot.
        env.append({"name": SNAPSHOT_ON_STOP_ENV, "value": snapshot_on_stop})
    env += kafka_env(spec)
    if spec.job.deploy_mode == "cluster":
        # PySpark starts its JVM through spark-submit with these arguments, so the
        # command stays `python -m eos_job run` in both deploy modes.
        env.append({"name": "PYSPARK_SUBMIT_ARGS",
                    "value": shlex.join(spark_submit_args(ref, spec, name) + ["pyspark-shell"])})
        env.append({"name": SPARK_MASTER_ENV, "value": "k8s"})
        env.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        # Executors dial the driver by the headless Service's name (driver_service), resolved by cluster DNS.
        env.append({"name": DRIVER_HOST_ENV, "value": driver_service_host(ref)})
        env.append({"name": "EOS_SERVICE_ACCOUNT",
                    "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}})
    if metrics is not None and spec.job.deploy_mode == "local":
        # Local mode keeps Spark on loopback (eos_job.session), which would hide the UI from Prometheus: the UI
        # binds every address of the Pod instead, its IP (Prometheus) and loopback (kubectl port-forward, which
        # the container runtime dials at localhost: `kubectl eos ui`); RPC stays on loopback.
        env.append({"name": UI_BIND_ENV, "value": UI_BIND_ALL})
    if spec.job.deploy_mode == "local":
        # The JVM heap sized for the container's limit, beside the JVM's other memory and Python (eos_job.memory);
        # in cluster mode spark-submit's spark.driver.memory says it.
        env.append({"name": DRIVER_HEAP_ENV, "value": driver_split_of(spec).spark_heap})
    resources = {"cpu": spec.job.driver.cpu, "memory": spec.job.driver.memory}
    container: dict[str, Any] = {
        "name": DRIVER_CONTAINER,
        "image": spec.job.image,
        "args": list(DRIVER_COMMAND),
        "env": env,
        "resources": {"requests": dict(resources), "limits": dict(resources)},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.job.deploy_mode == "cluster":
        container["ports"] = [{"name": "driver-rpc", "containerPort": DRIVER_PORT},
                              {"name": "blockmanager", "containerPort": BLOCK_MANAGER_PORT}]
    if metrics is not None:
        container.setdefault("ports", []).append({"name": METRICS_PORT_NAME, "containerPort": metrics.port})
    body = pod_body(_meta(ref, name, labels, {ANNOTATION_SPEC_HASH: spec.spec_hash()}), container,
                    grace_seconds=TERMINATION_GRACE_SECONDS, service_account=spec.job.service_account_name,
                    claim_name=spec.checkpoint.claim_name if spec.checkpoint.store == "pvc" else None,
                    mount_path=spec.checkpoint.path,
                    s3=spec.checkpoint.s3 if spec.checkpoint.store == "s3" else None)
    if spec.job.deploy_mode == "cluster":
        # Spark reads the executors' pod template from a file: the run ConfigMap's key, mounted.
        container.setdefault("volumeMounts", []).append({"name": "executor-template",
                                                         "mountPath": EXECUTOR_TEMPLATE_DIR, "readOnly": True})
        body["spec"].setdefault("volumes", []).append(
            {"name": "executor-template", "configMap": {"name": run_config_name(ref.name),
                                                        "items": [{"key": EXECUTOR_TEMPLATE_KEY,
                                                                   "path": EXECUTOR_TEMPLATE_KEY}]}})
    return spec.job.pod_template.apply(body)


def kafka_env(spec: ExactlyOnceStreamSpec) -> list[dict[str, Any]]:
    """The SASL and TLS material of both Kafka ends, by reference to the stream's Secrets (the runtime's
    ``kafka_security.KafkaSecrets.from_env`` reads them); the values are never copied anywhere else."""
    env = []
    for end, side in (("source", spec.source), ("sink", spec.sink)):
        for value, ref in secret_refs(side.credentials, side.tls).items():
            env.append({"name": env_name(end, value),
                        "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def pin_to_node(pod: dict[str, Any], node: str | None) -> dict[str, Any]:
    """A Pod that mounts the running driver's ReadWriteOnce claim lands on the driver's node (elsewhere it
    would wait for the volume for ever: Multi-Attach)."""
    if node:
        pod["spec"]["nodeSelector"] = {**pod["spec"].get("nodeSelector", {}), HOSTNAME_LABEL: node}
    return pod


def s3_env(s3) -> list[dict[str, Any]]:
    """How a Pod's storage layer and Spark reach a checkpoint bucket (``eos_job.storage.env_options``): the
    endpoint settings as values, the keys from the stream's Secret (never copied anywhere else)."""
    env = [{"name": "EOS_S3_REGION", "value": s3.region},
           {"name": "EOS_S3_PATH_STYLE", "value": str(bool(s3.path_style_access)).lower()}]
    if s3.endpoint:
        env.append({"name": "EOS_S3_ENDPOINT", "value": s3.endpoint})
    if s3.access_key_id is not None and s3.secret_access_key is not None:
        for var, ref in (("AWS_ACCESS_KEY_ID", s3.access_key_id), ("AWS_SECRET_ACCESS_KEY", s3.secret_access_key)):
            env.append({"name": var, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    return env


def pod_body(meta: dict[str, Any], container: dict[str, Any], *, grace_seconds: int, service_account: str | None,
             claim_name: str | None, mount_path: str, s3=None) -> dict[str, Any]:
    """What every Pod of the operator (driver, pre-flight, drain, snapshot take/inspect/dispose) has in common:
    one container run to completion (never restarted in place: a new attempt is a new Pod), the stream's
    identity, and the checkpoint store: its claim mounted at the checkpoint path (pvc), or the bucket's
    settings and keys in the environment (s3)."""
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": grace_seconds,
                                "containers": [container]}
    if s3 is not None:
        container["env"] = [*container.get("env", []), *s3_env(s3)]
    if current_format() != "text":
        # The operator's own log format (--log-format), passed on to everything it runs.
        container["env"] = [*container.get("env", []), {"name": FORMAT_ENV, "value": current_format()}]
    if service_account:
        pod_spec["serviceAccountName"] = service_account
    if claim_name is not None:
        container["volumeMounts"] = [{"name": CHECKPOINT_VOLUME, "mountPath": mount_path}]
        pod_spec["volumes"] = [{"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim_name}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def driver_service(ref: StreamRef) -> dict[str, Any]:
    """Headless Service giving the driver a stable DNS name for its executors (cluster mode)."""
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": _meta(ref, driver_service_name(ref.name),
                              {LABEL_MANAGED_BY: MANAGED_BY, LABEL_STREAM: ref.name}),
            "spec": {"clusterIP": "None", "selector": stream_selector(ref.name),
                     "publishNotReadyAddresses": True,
                     "ports": [{"name": "driver-rpc", "port": DRIVER_PORT, "targetPort": DRIVER_PORT},
                               {"name": "blockmanager", "port": BLOCK_MANAGER_PORT,
                                "targetPort": BLOCK_MANAGER_PORT}]}}


def aux_pod(ref: StreamRef, spec: ExactlyOnceStreamSpec, *, component: str, attempt: int, tx_generation: int,
            args: list[str]) -> dict[str, Any]:
    """A short-lived Pod of the stream that runs ``python -m eos_job <args>`` with the run config of
    ConfigMap ``<stream>-<component>``: same image, identity, resources and checkpoint volume as the
    driver, always Spark local mode (it writes no output of its own, or finishes one batch)."""
    body = driver_pod(ref, spec, attempt=attempt, tx_generation=tx_generation)
    name = aux_pod_name(ref.name, component, attempt)
    body["metadata"]["name"] = name
    body["metadata"]["labels"] = {**spec.job.pod_template.labels, **aux_selector(ref.name),
                                  LABEL_COMPONENT: component, LABEL_GENERATION: str(tx_generation),
                                  LABEL_ATTEMPT: str(attempt)}
    container = body["spec"]["containers"][0]
    container["name"] = component
    container["args"] = ["python", "-m", "eos_job", *args]
    container.pop("ports", None)
    # Always Spark local mode: no executors, so no executor template and none of cluster mode's settings.
    container["volumeMounts"] = [m for m in container.get("volumeMounts", []) if m["name"] != "executor-template"]
    body["spec"]["volumes"] = [v for v in body["spec"].get("volumes", []) if v["name"] != "executor-template"]
    if not container["volumeMounts"]:
        container.pop("volumeMounts")
    if not body["spec"]["volumes"]:
        body["spec"].pop("volumes")
    driver_only_env = ("PYSPARK_SUBMIT_ARGS", "EOS_DRIVER_POD", SPARK_MASTER_ENV, POD_IP_ENV, DRIVER_HOST_ENV,
                       "EOS_SERVICE_ACCOUNT", UI_BIND_ENV)
    env = [e for e in container["env"] if e["name"] not in driver_only_env]
    for e in env:
        if e["name"] == RUN_CONFIG_ENV:
            e["valueFrom"] = {"configMapKeyRef": {"name": aux_config_name(ref.name, component), "key": RUN_CONFIG_KEY}}
    container["env"] = env
    return body
