"""Pure builders of the child objects: run ConfigMap, driver Pod, Service, spark-submit arguments."""
from __future__ import annotations

from eos_job.spec import stream_uid  # noqa: E402
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from eos_job import pod_template
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig
from eos_operator import children
from eos_operator.children import StreamRef
from eos_operator.validation import validate_spec

from .fakes import base_spec

SCRATCH = {"name": pod_template.SCRATCH_VOLUME, "emptyDir": {}}
SCRATCH_MOUNT = {"name": pod_template.SCRATCH_VOLUME, "mountPath": pod_template.SCRATCH_DIR}

REF = StreamRef("colors", "team-a", "0f6c2a1e-1111-2222-3333-444455556666")
KEYS = {"accessKeyId": {"name": "keys", "key": "id"}, "secretAccessKey": {"name": "keys", "key": "secret"}}


def spec(**overrides) -> ExactlyOnceStreamSpec:
    s = validate_spec(base_spec(**overrides))
    assert isinstance(s, ExactlyOnceStreamSpec), s
    return s


def test_run_config_map_holds_the_rendered_run_config():
    s = spec()
    cm = children.run_config_map(REF, children.run_config(REF, s, tx_generation=3))
    assert cm["metadata"]["name"] == "colors-run"
    assert cm["metadata"]["ownerReferences"][0]["uid"] == REF.uid
    assert cm["metadata"]["ownerReferences"][0]["controller"] is True
    cfg = RunConfig.model_validate_json(cm["data"]["run.json"])
    assert cfg.stream.name == "colors" and cfg.stream.namespace == "team-a"
    assert cfg.stream.uid == stream_uid(REF.namespace, REF.name) and cfg.stream.generation == 3
    assert cfg.spec == s
    assert cfg.checkpoint_dir == "/tmp/eos-test/live"
    assert '"checkpointDir"' in cm["data"]["run.json"]         # camelCase, as the runtime reads it


def test_driver_pod_runs_the_real_runtime_command():
    s = spec()
    pod = children.driver_pod(REF, s, attempt=4, tx_generation=1)
    meta, podspec = pod["metadata"], pod["spec"]
    assert meta["name"] == "colors-driver-4" and meta["namespace"] == "team-a"
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "eos-operator"
    assert meta["labels"]["streaming.eos.dev/stream"] == "colors"
    assert meta["labels"]["streaming.eos.dev/generation"] == "1"
    assert meta["labels"]["streaming.eos.dev/attempt"] == "4"
    assert meta["ownerReferences"] == [REF.owner_reference()]
    assert podspec["restartPolicy"] == "Never"
    assert podspec["terminationGracePeriodSeconds"] == 60
    (c,) = podspec["containers"]
    assert c["args"] == ["python", "-m", "eos_job", "run", "--config-env", "EOS_RUN_CONFIG"]
    env = {e["name"]: e for e in c["env"]}
    assert env["EOS_RUN_CONFIG"]["valueFrom"] == {"configMapKeyRef": {"name": "colors-run", "key": "run.json"}}
    assert c["resources"]["limits"] == {"cpu": "1", "memory": "1Gi"}
    # 1Gi (the default), one CPU, local mode: 224 MiB for Python (the runtime and one worker), 320 MiB of JVM
    # overhead, the rest heap: 480 MiB, the smallest Spark starts with.
    assert env["EOS_DRIVER_HEAP"]["value"] == "480m"
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert podspec["volumes"] == [SCRATCH]           # store=local: the path as it is; only the scratch volume
    assert c["volumeMounts"] == [SCRATCH_MOUNT] and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert env["TMPDIR"]["value"] == env["HOME"]["value"] == pod_template.SCRATCH_DIR
    assert "PYSPARK_SUBMIT_ARGS" not in env
    # Selecting every attempt's Pod works with the labels it carries.
    assert children.stream_selector("colors").items() <= meta["labels"].items()


def test_pvc_checkpoint_is_mounted_at_the_path():
    s = spec(checkpoint={"store": "pvc", "claimName": "ckpt", "path": "/checkpoints/colors"})
    pod = children.driver_pod(REF, s, attempt=0, tx_generation=0)
    assert pod["spec"]["volumes"] == [{"name": "checkpoint", "persistentVolumeClaim": {"claimName": "ckpt"}}, SCRATCH]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [{"name": "checkpoint",
                                                              "mountPath": "/checkpoints/colors"}, SCRATCH_MOUNT]


def test_credentials_come_from_secret_references_only():
    s = spec(sink={"bootstrapServers": "k:9093", "topic": "out", "credentials": {
        "username": {"name": "kafka-user", "key": "user"}, "password": {"name": "kafka-user", "key": "pass"}}})
    pod = children.driver_pod(REF, s, attempt=0, tx_generation=0)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["EOS_SINK_SASL_USERNAME"]["valueFrom"] == {"secretKeyRef": {"name": "kafka-user", "key": "user"}}
    assert env["EOS_SINK_SASL_PASSWORD"]["valueFrom"] == {"secretKeyRef": {"name": "kafka-user", "key": "pass"}}
    assert all("value" not in e for e in env.values() if e["name"].startswith("EOS_SINK_SASL"))


def test_cluster_mode_spark_submit_arguments():
    s = spec(job={"module": "m", "deployMode": "cluster", "parallelism": 4, "image": "registry/eos:1",
                  "executor": {"instances": 3, "cpu": "2", "memory": "4Gi"},
                  "sparkConf": {"spark.ui.enabled": "false", "spark.kubernetes.driver.pod.name": "hijack"},
                  "serviceAccountName": "spark"})
    args = children.spark_submit_args(REF, s, "colors-driver-2")
    assert args[:4] == ["--deploy-mode", "client", "--name", "colors"]
    conf = dict(a.split("=", 1) for a in args[5::2])
    assert all(flag == "--conf" for flag in args[4::2])
    assert conf["spark.kubernetes.namespace"] == "team-a"
    assert conf["spark.kubernetes.container.image"] == "registry/eos:1"
    assert conf["spark.kubernetes.driver.pod.name"] == "colors-driver-2"     # pinned, not the user's value
    assert "spark.driver.host" not in conf and "--master" not in args   # known only in the Pod: the session
    assert conf["spark.driver.port"] == "7078" and conf["spark.driver.blockManager.port"] == "7079"
    # 4Gi, one task slot (spark.executor.cores unset): 64 MiB for its Python worker, 10 % of the heap for the
    # JVM's overhead, the heap 3,648 MiB; spark.executor.memoryOverhead, which Spark adds to the heap for the
    # Pod's limit, the rest (448): heap + overhead = job.executor.memory, the limit the spec asked for.
    assert conf["spark.executor.instances"] == "3" and conf["spark.executor.memory"] == "3648m"
    assert conf["spark.executor.memoryOverhead"] == "448m"
    # The driver of a cluster-mode stream runs no Python worker: 1Gi leaves 544 MiB of heap.
    assert conf["spark.driver.memory"] == "544m"
    assert conf["spark.kubernetes.executor.request.cores"] == "2"
    assert conf["spark.sql.shuffle.partitions"] == "4"
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "spark"
    assert conf["spark.kubernetes.executor.label.streaming.eos.dev/stream"] == "colors"
    assert conf["spark.ui.enabled"] == "false"
    pod = children.driver_pod(REF, s, attempt=2, tx_generation=0)
    c = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert shlex.split(env["PYSPARK_SUBMIT_ARGS"]) == args + ["pyspark-shell"]
    assert env["EOS_SPARK_MASTER"] == "k8s"
    assert {e["name"]: e for e in c["env"]}["EOS_POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # Executors dial the driver by its headless Service's DNS name, the Service the operator makes for it.
    service = children.driver_service(REF)
    assert env["EOS_DRIVER_HOST"] == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    aux = children.aux_pod(REF, s, component="preflight", attempt=2, tx_generation=0, args=["preflight"])
    assert not {"EOS_DRIVER_HOST", "EOS_POD_IP"} & {e["name"] for e in aux["spec"]["containers"][0]["env"]}
    assert c["args"][:3] == ["python", "-m", "eos_job"]
    assert {p["containerPort"] for p in c["ports"]} == {7078, 7079}


EXECUTOR_PVC = "spark.kubernetes.executor.volumes.persistentVolumeClaim."


def test_cluster_mode_executors_mount_a_pvc_checkpoint_and_nothing_for_s3():
    """The state store writes under the checkpoint on executors too: with store pvc they mount the claim,
    writable, at the checkpoint path; an object store needs no volume."""
    pvc = spec(job={"module": "m", "deployMode": "cluster"},
               checkpoint={"store": "pvc", "claimName": "ckpt", "path": "/checkpoints/colors"})
    args = children.spark_submit_args(REF, pvc, "colors-driver-0")
    conf = dict(a.split("=", 1) for a in args[5::2])
    assert {k: v for k, v in conf.items() if k.startswith(EXECUTOR_PVC)} == {
        EXECUTOR_PVC + "checkpoint.options.claimName": "ckpt",
        EXECUTOR_PVC + "checkpoint.mount.path": "/checkpoints/colors",
        EXECUTOR_PVC + "checkpoint.mount.readOnly": "false"}
    env = {e["name"]: e.get("value") for e in children.driver_pod(REF, pvc, attempt=0, tx_generation=0)
           ["spec"]["containers"][0]["env"]}
    assert shlex.split(env["PYSPARK_SUBMIT_ARGS"]) == args + ["pyspark-shell"]   # what the driver runs with
    s3 = spec(job={"module": "m", "deployMode": "cluster"},
              checkpoint={"store": "s3", "path": "/streams/colors", "s3": {"bucket": "ckpt", **KEYS}})
    assert not [a for a in children.spark_submit_args(REF, s3, "colors-driver-0") if a.startswith(EXECUTOR_PVC)]


def test_headless_driver_service_selects_the_driver():
    svc = children.driver_service(REF)
    assert svc["metadata"]["name"] == "colors-driver"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == children.stream_selector("colors")
    assert svc["metadata"]["ownerReferences"] == [REF.owner_reference()]


def test_names_are_deterministic():
    assert children.driver_pod_name("colors", 0) == "colors-driver-0"
    assert children.run_config_name("colors") == "colors-run"
    s = spec()
    assert children.driver_pod(REF, s, attempt=1, tx_generation=0) == children.driver_pod(REF, s, attempt=1,
                                                                                           tx_generation=0)


def test_run_config_round_trips_through_the_runtime_loader():
    """What the driver does with EOS_RUN_CONFIG: json -> load_run_config -> the same RunConfig."""
    from eos_job.spec import load_run_config
    s = spec()
    cfg = children.run_config(REF, s, 0)
    cm = children.run_config_map(REF, cfg)
    assert load_run_config(json.loads(cm["data"]["run.json"])) == cfg


def test_cli_help_works_without_a_cluster():
    root = children.__file__.rsplit("/operator/", 1)[0]
    env = {**os.environ, "KUBECONFIG": "/nonexistent", "PYTHONPATH": os.pathsep.join(
        [f"{root}/operator", f"{root}/jobs", root, os.environ.get("PYTHONPATH", "")])}
    for argv in (["--help"], ["run", "--help"]):
        out = subprocess.run([sys.executable, "-m", "eos_operator", *argv], capture_output=True, text=True,
                             env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "usage: python -m eos_operator" in out.stdout
    assert "--all-namespaces" in out.stdout and "--kubeconfig" in out.stdout and "--liveness" in out.stdout


def test_pod_view_reads_exit_code_and_the_runtime_termination_message():
    from eos_operator.observed import pod_view
    pod = {"metadata": {"name": "colors-driver-1", "labels": {"streaming.eos.dev/attempt": "1"},
                        "ownerReferences": [{"uid": REF.uid, "controller": True}]},
           "status": {"phase": "Failed", "containerStatuses": [{"name": "driver", "state": {"terminated": {
               "exitCode": 3, "reason": "Error",
               "message": json.dumps({"reason": "SinkUnavailable", "error": "sink.topic: topic 'x' does not exist",
                                      "batches": 0})}}}]}}
    view = pod_view(pod)
    assert (view.name, view.phase, view.exit_code, view.attempt, view.owner_uid) == (
        "colors-driver-1", "Failed", 3, 1, REF.uid)
    assert view.failure_text() == ("driver Pod colors-driver-1 failed (exit code 3, Error): "
                                   "SinkUnavailable: sink.topic: topic 'x' does not exist")
    plain = pod_view({"metadata": {"name": "p"}, "status": {"phase": "Failed", "containerStatuses": [
        {"name": "driver", "state": {"terminated": {"exitCode": 137, "message": "log tail\n"}}}]}})
    assert plain.failure_text() == "driver Pod p failed (exit code 137): log tail"
    assert pod_view({"metadata": {"name": "q"}}).phase == "Pending"


def test_derived_names_fit_a_label_for_the_longest_stream_name_the_crd_allows():
    long = "payments-enrichment-orders-to-ledger-eu-west-1-prod-abcd"
    assert len(long) == children.MAX_STREAM_NAME == 56
    ref = StreamRef(long, "team-a", REF.uid)
    assert len(children.driver_service_name(long)) == 63
    names = [children.snapshot_name(ref, 12345), children.fitted_name(long, "-n9999999999"),
             children.fitted_name(long, "-p1795448000")]
    assert all(len(n) <= 63 for n in names), names
    assert names[0].endswith("-0f6c2a1e-a12345") and names[1].endswith("-n9999999999")
    assert all(n.startswith("payments-enrichment-orders") for n in names)
    # Stable, and two streams sharing a long prefix still get different names.
    other = long[:-1] + "x"
    assert children.fitted_name(long, "-p17") == children.fitted_name(long, "-p17") != \
        children.fitted_name(other, "-p17")
    # Short names are as before.
    assert children.snapshot_name(REF, 3) == "colors-0f6c2a1e-a3"
    assert children.fitted_name("colors", "-n1") == "colors-n1"


def test_s3_store_pods_get_the_bucket_settings_and_keys_by_reference():
    s = spec(checkpoint={"store": "s3", "path": "/streams/colors",
                         "s3": {"bucket": "ckpt", "endpoint": "http://minio:9000", "pathStyleAccess": True,
                                "accessKeyId": {"name": "s3-keys", "key": "id"},
                                "secretAccessKey": {"name": "s3-keys", "key": "secret"}}})
    pod = children.driver_pod(REF, s, attempt=0, tx_generation=0)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["EOS_S3_ENDPOINT"]["value"] == "http://minio:9000" and env["EOS_S3_PATH_STYLE"]["value"] == "true"
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"] == {"secretKeyRef": {"name": "s3-keys", "key": "id"}}
    assert env["AWS_SECRET_ACCESS_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "s3-keys", "key": "secret"}}
    assert pod["spec"]["volumes"] == [SCRATCH], "nothing to mount for an object store"
    assert children.checkpoint_dir(s) == "s3a://ckpt/streams/colors/live"
    assert children.snapshot_path(REF, s, 2).startswith("s3a://ckpt/streams/colors/snapshots/")


TEMPLATE = {"labels": {"team": "payments", "streaming.eos.dev/stream": "hijack"},
            "annotations": {"cost-center": "42"}, "nodeSelector": {"pool": "streaming"},
            "tolerations": [{"key": "dedicated", "value": "spark", "effect": "NoSchedule"}],
            "priorityClassName": "streaming-high", "imagePullSecrets": ["registry-creds"],
            "env": [{"name": "TZ", "value": "UTC"}]}


def test_pod_templates_merge_and_the_operator_wins():
    res = validate_spec({**base_spec(), "job": {"module": "m", "podTemplate": TEMPLATE}})
    assert any(e.startswith("spec.job.podTemplate.labels.streaming.eos.dev/stream") for e in res.errors), res
    ok = {**TEMPLATE, "labels": {"team": "payments"}}
    s = spec(job={"module": "m", "podTemplate": ok})
    pod = children.driver_pod(REF, s, attempt=1, tx_generation=0)
    assert pod["metadata"]["labels"]["team"] == "payments"
    assert pod["metadata"]["labels"]["streaming.eos.dev/stream"] == "colors"
    assert pod["metadata"]["annotations"]["cost-center"] == "42"
    assert pod["spec"]["nodeSelector"] == {"pool": "streaming"} and pod["spec"]["priorityClassName"] == "streaming-high"
    assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "spark",
                                           "effect": "NoSchedule"}]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["TZ"] == "UTC" and "EOS_DRIVER_POD" in env
    # The stream's short-lived Pods land where the driver may (same scheduling), with their own labels.
    aux = children.aux_pod(REF, s, component="preflight", attempt=1, tx_generation=0, args=["preflight"])
    assert aux["spec"]["nodeSelector"] == {"pool": "streaming"} and aux["metadata"]["labels"]["team"] == "payments"
    assert aux["metadata"]["labels"][children.LABEL_COMPONENT] == "preflight"


def test_a_scheduler_name_reaches_every_pod_of_the_stream_and_the_run_config_as_the_spec_says():
    """``podTemplate.schedulerName`` (a scheduler profile of its own, the stack's real nodes') is set on the
    driver, the short-lived Pods and the executors' template; the run config carries the spec as it is (the
    driver's spec hash is the operator's: an image older than the field refuses it, as the version-skew policy
    says)."""
    from eos_job.spec import StreamIdentity
    s = spec(job={"module": "m", "deployMode": "cluster",
                  "podTemplate": {"schedulerName": "eos-real-nodes", "priorityClassName": "streaming-high"},
                  "executor": {"podTemplate": {"schedulerName": "eos-real-nodes"}}})
    assert children.driver_pod(REF, s, attempt=0, tx_generation=0)["spec"]["schedulerName"] == "eos-real-nodes"
    aux = children.aux_pod(REF, s, component="preflight", attempt=0, tx_generation=0, args=["preflight"])
    assert aux["spec"]["schedulerName"] == "eos-real-nodes"
    cm = children.run_config_map(REF, RunConfig(stream=StreamIdentity(name="colors", namespace="team-a", uid=REF.uid,
                                                                      generation=0), spec=s, checkpoint_dir="/c"))
    assert json.loads(cm["data"]["executor-template.yaml"])["spec"]["schedulerName"] == "eos-real-nodes"
    run = RunConfig.model_validate(json.loads(cm["data"]["run.json"]))
    assert run.spec.job.pod_template.scheduler_name == "eos-real-nodes" and run.spec == s
    unset = children.driver_pod(REF, spec(job={"module": "m"}), attempt=0, tx_generation=0)
    assert "schedulerName" not in unset["spec"], "unset: the cluster's default scheduler"
    res = validate_spec({**base_spec(), "job": {"module": "m", "podTemplate": {"schedulerName": "Not A Name"}}})
    assert any("schedulerName" in e for e in res.errors), res



def test_executor_templates_become_spark_settings_and_a_template_file():
    res = validate_spec({**base_spec(), "job": {"module": "m", "executor": {"podTemplate": {
        "env": [{"name": "SPARK_HOME", "value": "/x"}]}}}})
    assert any(e.startswith("spec.job.executor.podTemplate.env.SPARK_HOME") for e in res.errors), res
    ok = {**TEMPLATE, "labels": {"team": "payments"}}
    s = spec(job={"module": "m", "deployMode": "cluster", "executor": {"podTemplate": ok}})
    conf = dict(a.split("=", 1) for a in children.spark_submit_args(REF, s, "colors-driver-0")[5::2])
    assert conf["spark.kubernetes.executor.label.team"] == "payments"
    assert conf["spark.kubernetes.executor.annotation.cost-center"] == "42"
    assert conf["spark.kubernetes.node.selector.pool"] == "streaming" and conf["spark.executorEnv.TZ"] == "UTC"
    assert conf["spark.kubernetes.executor.podTemplateFile"] == "/etc/eos/executor-template.yaml"
    from eos_job.spec import StreamIdentity
    cm = children.run_config_map(REF, RunConfig(stream=StreamIdentity(name="colors", namespace="team-a", uid=REF.uid,
                                                                      generation=0), spec=s, checkpoint_dir="/c"))
    template = json.loads(cm["data"]["executor-template.yaml"])
    assert template["spec"]["priorityClassName"] == "streaming-high"
    assert template["spec"]["imagePullSecrets"] == [{"name": "registry-creds"}]
    pod = children.driver_pod(REF, s, attempt=0, tx_generation=0)
    mount = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}["executor-template"]
    assert mount["mountPath"] == "/etc/eos"
    aux = children.aux_pod(REF, s, component="drain", attempt=0, tx_generation=0, args=["run"])
    assert "volumes" not in aux["spec"] or all(v["name"] != "executor-template" for v in aux["spec"]["volumes"])
    assert not {"PYSPARK_SUBMIT_ARGS", "EOS_SPARK_MASTER"} & {e["name"] for e in aux["spec"]["containers"][0]["env"]}


def restricted_violations(pod: dict) -> list[str]:
    """The restricted Pod Security checks that apply to these Pods (the API server's e2e proof is
    tests/stack/test_kube.py plus every e2e namespace enforcing it)."""
    spec_, out = pod["spec"], []
    ctx = spec_.get("securityContext") or {}
    if ctx.get("seccompProfile", {}).get("type") != "RuntimeDefault":
        out.append("seccompProfile")
    for c in spec_["containers"]:
        cc = c.get("securityContext") or {}
        if not (cc.get("runAsNonRoot") or ctx.get("runAsNonRoot")):
            out.append(f"{c.get('name')}: runAsNonRoot")
        if (cc.get("runAsUser") if "runAsUser" in cc else ctx.get("runAsUser")) == 0:
            out.append(f"{c.get('name')}: runAsUser 0")
        if cc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{c.get('name')}: allowPrivilegeEscalation")
        if cc.get("capabilities", {}).get("drop") != ["ALL"]:
            out.append(f"{c.get('name')}: capabilities")
    out += [f"hostPath volume {v['name']}" for v in spec_.get("volumes", []) if "hostPath" in v]
    return out


def test_every_pod_meets_restricted_pod_security():
    from eos_job.snapshot_resource import SnapshotAccess  # noqa: F401 - the access records the context
    from eos_operator.snapshots import SnapshotRef, access_of, snapshot_pod

    for s in (spec(), spec(job={"module": "m", "deployMode": "cluster"}),
              spec(checkpoint={"store": "pvc", "claimName": "ckpt", "path": "/ckpt"})):
        driver = children.driver_pod(REF, s, attempt=1, tx_generation=0)
        aux = children.aux_pod(REF, s, component="drain", attempt=1, tx_generation=0, args=["drain"])
        snap = snapshot_pod(SnapshotRef(namespace="default", name="snap", uid="u"), "colors", access_of(s),
                            name="snap-0", action="take", command=["true"])
        for pod in (driver, aux, snap):
            assert restricted_violations(pod) == [], pod
            assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    cluster = spec(job={"module": "m", "deployMode": "cluster",
                        "executor": {"podTemplate": {"securityContext": {"runAsUser": 2000, "fsGroup": None}}}})
    template = json.loads(children.run_config_map(REF, children.run_config(REF, cluster, tx_generation=0))
                          ["data"][children.EXECUTOR_TEMPLATE_KEY])
    assert restricted_violations(template) == [] and template["spec"]["securityContext"]["runAsUser"] == 2000
    assert "fsGroup" not in template["spec"]["securityContext"]
    res = validate_spec({**base_spec(), "job": {"module": "m", "podTemplate": {"securityContext": {"runAsUser": 0}}}})
    assert any("runAsUser" in e for e in res.errors), res


def test_affinity_and_extra_volumes_reach_driver_aux_pods_and_executors():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["streaming"]}]}]}}}
    template = {"affinity": affinity, "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}
    s = spec(job={"module": "m", "deployMode": "cluster", "podTemplate": template,
                  "executor": {"podTemplate": template}})
    for pod in (children.driver_pod(REF, s, attempt=1, tx_generation=0),
                children.aux_pod(REF, s, component="drain", attempt=1, tx_generation=0, args=["drain"])):
        assert pod["spec"]["affinity"] == affinity
        assert {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}} in pod["spec"]["volumes"]
        assert {"name": "scratch", "mountPath": "/scratch", "readOnly": False} in \
            pod["spec"]["containers"][0]["volumeMounts"]
    executor = json.loads(children.run_config_map(REF, children.run_config(REF, s, tx_generation=0))
                          ["data"][children.EXECUTOR_TEMPLATE_KEY])
    assert executor["spec"]["affinity"] == affinity
    assert executor["spec"]["volumes"] == [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}}, SCRATCH]
    assert executor["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == "/scratch"
    # The executor's root is read-only too: temporary files and the fetched jars (its working directory) go to
    # the operator's scratch volume.
    (container,) = executor["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["volumeMounts"][-1] == SCRATCH_MOUNT and container["workingDir"] == pod_template.SCRATCH_DIR
    assert {"name": "TMPDIR", "value": pod_template.SCRATCH_DIR} in container["env"]
    bad = {"volumes": [{"name": "checkpoint", "emptyDir": {}}, {"emptyDir": {}}],
           "volumeMounts": [{"name": "nope", "mountPath": "/x"}]}
    res = validate_spec({**base_spec(), "job": {"module": "m", "podTemplate": bad}})
    assert any(e.startswith("spec.job.podTemplate.volumes.checkpoint") for e in res.errors), res.errors
    assert any("volumes[1].name" in e for e in res.errors) and any("volumeMounts.nope" in e for e in res.errors)
    # The scratch volume and the variables pointing at it are the operator's.
    mine = {"volumes": [{"name": "eos-scratch", "emptyDir": {}}], "env": [{"name": "TMPDIR", "value": "/tmp"}]}
    res = validate_spec({**base_spec(), "job": {"module": "m", "podTemplate": mine}})
    assert any(e.startswith("spec.job.podTemplate.volumes.eos-scratch") for e in res.errors), res.errors
    assert any(e.startswith("spec.job.podTemplate.env.TMPDIR") for e in res.errors), res.errors


def test_the_jvm_and_hadoop_take_their_temporary_folder_from_tmpdir(tmp_path, monkeypatch):
    from eos_job.session import temp_dir_option
    assert temp_dir_option({}) == "" and temp_dir_option({"TMPDIR": str(tmp_path / "missing")}) == ""
    assert temp_dir_option({"TMPDIR": str(tmp_path)}) == f"-Djava.io.tmpdir={tmp_path}"
    # The executor's entrypoint does the same with the variable (Spark starts executors without our runtime).
    script = (Path(__file__).resolve().parents[2] / "docker" / "entrypoint.sh").read_text()
    assert '"-Djava.io.tmpdir=${TMPDIR}"' in script


def test_no_driver_or_executor_gets_a_runtime_variable_from_the_spec():
    """The unsafe switches and fault hooks (eos_job.faults) are EOS_* variables: validation refuses them in
    sparkConf and the Pod templates, and the builders never pass one on, even from a spec that skipped it."""
    sneaky = {"spark.executorEnv.EOS_UNSAFE_DISABLE": "ledger-skip", "spark.kubernetes.driverEnv.EOS_UNSAFE_DISABLE":
              "fence", "spark.kubernetes.executor.secretKeyRef.EOS_FAULT_KILL_AFTER_COMMIT": "s:k",
              "spark.kubernetes.executor.podTemplateFile": "/mine.yaml", "spark.executorEnv.TZ": "UTC"}
    env = [{"name": "EOS_UNSAFE_DISABLE", "value": "ledger-skip"}, {"name": "EOS_FAULT_HOLD_OPEN", "value": "60"}]
    raw = {**base_spec(), "job": {"module": "m", "deployMode": "cluster", "sparkConf": sneaky,
                                  "podTemplate": {"env": env}, "executor": {"podTemplate": {"env": env}}}}
    refused = validate_spec(raw)
    assert not isinstance(refused, ExactlyOnceStreamSpec)
    assert {e.split(":")[0] for e in refused.errors} == {
        "spec.job.sparkConf.spark.executorEnv.EOS_UNSAFE_DISABLE", "spec.job.sparkConf.spark.kubernetes.driverEnv."
        "EOS_UNSAFE_DISABLE", "spec.job.sparkConf.spark.kubernetes.executor.secretKeyRef.EOS_FAULT_KILL_AFTER_COMMIT",
        "spec.job.sparkConf.spark.kubernetes.executor.podTemplateFile", "spec.job.podTemplate.env.EOS_UNSAFE_DISABLE",
        "spec.job.podTemplate.env.EOS_FAULT_HOLD_OPEN", "spec.job.executor.podTemplate.env.EOS_UNSAFE_DISABLE",
        "spec.job.executor.podTemplate.env.EOS_FAULT_HOLD_OPEN"}
    s = ExactlyOnceStreamSpec.model_validate(raw)          # as if validation had been skipped
    pod = children.driver_pod(REF, s, attempt=0, tx_generation=0)
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert not [n for n in names if n.startswith(("EOS_UNSAFE", "EOS_FAULT"))], names
    submit = next(e["value"] for e in pod["spec"]["containers"][0]["env"] if e["name"] == "PYSPARK_SUBMIT_ARGS")
    assert "EOS_UNSAFE" not in submit and "EOS_FAULT" not in submit and "spark.executorEnv.TZ=UTC" in submit
    assert "executor.podTemplateFile=/etc/eos/executor-template.yaml" in submit and "/mine.yaml" not in submit
