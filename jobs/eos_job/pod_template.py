"""Pod templates: what a platform adds to a stream's Pods (scheduling, affinity, pull secrets, labels, env,
extra volumes, the user they run as).

``job.podTemplate`` applies to the driver Pod and the stream's short-lived Pods (pre-flight, drain), which
must land where the driver may; ``job.executor.podTemplate`` to the executor Pods Spark creates in cluster
mode (as Spark settings: labels, annotations, node selector and env; tolerations, priority class, scheduler
name and image pull secrets through Spark's executor pod template file, which the operator writes into the
run ConfigMap).

Merged with what the operator owns, which always wins and cannot be set here: its labels (prefix
``streaming.eos.dev/``, ``app.kubernetes.io/managed-by`` and ``component``, Spark's ``spark-role``,
``spark-app-selector``, ``spark-exec-id``), the container's command, image, resources,
ports and checkpoint volume, and the environment it passes (names starting ``EOS_``, ``SPARK_``,
``PYSPARK_``, and the checkpoint's ``AWS_`` keys). A template that sets one of those is refused with the
field named.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from .model import Model

LABEL_KEY = r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
DNS_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
OWNED_LABEL_PREFIXES = ("streaming.eos.dev/", "app.kubernetes.io/managed-by", "app.kubernetes.io/component",
                        "spark-role", "spark-app-selector", "spark-exec-id")
OWNED_ENV_PREFIXES = ("EOS_", "SPARK_", "PYSPARK_", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OWNED_ENV_NAMES = ("TMPDIR", "HOME")   # pointed at the scratch volume


def owned_env(name: str) -> bool:
    """Whether the operator owns (sets) the environment variable ``name``: a template never sets it."""
    return name.startswith(OWNED_ENV_PREFIXES) or name in OWNED_ENV_NAMES


class Toleration(Model):
    key: str | None = Field(None, pattern=LABEL_KEY, description="The taint key; unset with Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Equal: key and value match; Exists: the key.")
    value: str | None = Field(None, max_length=63, description="The taint value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint effect tolerated; unset: every effect.")
    toleration_seconds: int | None = Field(None, ge=0, description="NoExecute: how long the Pod stays bound.")


def _owned_env_rule() -> dict[str, str]:
    """CEL on an env entry's name: what ``PodTemplate.errors`` refuses, refused by the API server at once."""
    owned = " || ".join([f"self.startsWith('{p}')" for p in OWNED_ENV_PREFIXES] +
                        [f"self == '{n}'" for n in OWNED_ENV_NAMES])
    names = ", ".join([f"{p}*" if p.endswith("_") else p for p in OWNED_ENV_PREFIXES] + list(OWNED_ENV_NAMES))
    return {"rule": f"!({owned})",
            "message": f"the operator sets the variables {names} (the runtime's EOS_* among them); a Pod template "
                       "must not: choose another name"}


MAX_ENV = 128


class EnvVar(Model):
    name: str = Field(..., pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=253, description="The variable's name.",
                      json_schema_extra={"x-kubernetes-validations": [_owned_env_rule()]})
    value: str = Field("", max_length=32768, description="Its value (literal; Secrets come through the spec's "
                                                         "credential fields).")


IMAGE_UID = 10001   # the image's user (Dockerfile: USER 10001:10001)
# What the `restricted` Pod Security level asks of every container, and a read-only root filesystem; a
# template cannot loosen it.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                      "runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"},
                      "readOnlyRootFilesystem": True}
# The one writable place of a container besides its volumes: an emptyDir where temporary files go (Python's
# tempfile through TMPDIR, the JVM's java.io.tmpdir, Spark's local dir in local mode, HOME). Not /tmp: the
# image's /tmp stays read-only like the rest of its root, so a file written anywhere else fails loudly.
SCRATCH_VOLUME = "eos-scratch"
SCRATCH_DIR = "/var/run/eos-scratch"


class PodSecurity(Model):
    """Who the Pods run as. Always non-root, no privilege escalation, no capabilities and the runtime's
    default seccomp profile: every Pod meets the ``restricted`` Pod Security level."""
    run_as_user: int = Field(IMAGE_UID, ge=1, description="UID of the containers (never 0).")
    run_as_group: int = Field(IMAGE_UID, ge=0, description="Primary GID of the containers.")
    fs_group: int | None = Field(IMAGE_UID, ge=0, description=(
        "GID that owns mounted volumes (a checkpoint claim); null leaves volume ownership alone."))

    def pod_context(self) -> dict:
        ctx = {"runAsNonRoot": True, "runAsUser": self.run_as_user, "runAsGroup": self.run_as_group,
               "seccompProfile": {"type": "RuntimeDefault"}}
        if self.fs_group is not None:
            ctx["fsGroup"] = self.fs_group
        return ctx

    def apply(self, pod: dict) -> dict:
        """``pod`` with this pod-level context, the restricted container context and a read-only root on every
        container, and the scratch volume mounted in each with TMPDIR and HOME pointing at it."""
        spec = pod["spec"]
        spec["securityContext"] = self.pod_context()
        if not any(v.get("name") == SCRATCH_VOLUME for v in spec.get("volumes", [])):
            spec["volumes"] = [*spec.get("volumes", []), {"name": SCRATCH_VOLUME, "emptyDir": {}}]
        for container in spec["containers"]:
            container["securityContext"] = {**CONTAINER_SECURITY}
            mounts = [m for m in container.get("volumeMounts", []) if m.get("name") != SCRATCH_VOLUME]
            container["volumeMounts"] = [*mounts, {"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR}]
            env = [e for e in container.get("env", []) if e.get("name") not in OWNED_ENV_NAMES]
            container["env"] = [*env, {"name": "TMPDIR", "value": SCRATCH_DIR}, {"name": "HOME", "value": SCRATCH_DIR}]
        return pod


OWNED_VOLUMES = ("checkpoint", "executor-template", "spark-local-dir-", "spark-conf-volume", "kube-api-access-",
                 SCRATCH_VOLUME)


class VolumeMount(Model):
    name: str = Field(..., pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$", description="A volume of volumes.")
    mount_path: str = Field(..., pattern=r"^/", max_length=1024, description="Absolute path in the container.")
    read_only: bool = Field(False, description="Mount it read-only.")
    sub_path: str | None = Field(None, max_length=1024, description="A path inside the volume to mount.")


class PodPlacement(Model):
    """Where the Pods may run and how they pull their image: the part of ``job.podTemplate`` a snapshot records
    (``SnapshotAccess``), so its Pods land where the driver's may and can pull its image, even after the
    stream is gone."""
    node_selector: dict[str, str] = Field(default_factory=dict, description="The Pods' nodeSelector.")
    tolerations: list[Toleration] = Field(default_factory=list, description="The Pods' tolerations.")
    priority_class_name: str | None = Field(None, pattern=DNS_NAME, description="The Pods' priorityClassName.")
    scheduler_name: str | None = Field(None, pattern=DNS_NAME, description=(
        "The Pods' schedulerName: a scheduler (profile) other than the cluster's default, e.g. a batch "
        "scheduler or a pool's own; unset: the default scheduler."))
    image_pull_secrets: list[str] = Field(default_factory=list, description=(
        "Names of Secrets in the stream's namespace to pull the image with."))
    affinity: dict[str, Any] = Field(default_factory=dict, description=(
        "The Pods' affinity (nodeAffinity, podAffinity, podAntiAffinity) as a Pod spec spells it."))

    def placement(self) -> "PodPlacement":
        """Only these fields (of a ``PodTemplate``, which is one)."""
        return PodPlacement(**{name: getattr(self, name) for name in PodPlacement.model_fields})

    def place(self, pod: dict) -> dict:
        """``pod`` with this placement's fields set (only those set)."""
        if self.node_selector:
            pod["spec"]["nodeSelector"] = dict(self.node_selector)
        pod["spec"].update(self._pod_spec_fields())
        return pod

    def _pod_spec_fields(self) -> dict:
        """Tolerations, priority class, scheduler, pull secrets and affinity, as a Pod spec spells them (only
        those set; the node selector apart: an executor takes it as a Spark setting)."""
        spec: dict = {}
        if self.scheduler_name:
            spec["schedulerName"] = self.scheduler_name
        if self.tolerations:
            spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in self.tolerations]
        if self.priority_class_name:
            spec["priorityClassName"] = self.priority_class_name
        if self.image_pull_secrets:
            spec["imagePullSecrets"] = [{"name": n} for n in self.image_pull_secrets]
        if self.affinity:
            spec["affinity"] = dict(self.affinity)
        return spec


class PodTemplate(PodPlacement):
    labels: dict[str, str] = Field(default_factory=dict, description="Added to the Pods' labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to the Pods' annotations.")
    env: list[EnvVar] = Field(default_factory=list, max_length=MAX_ENV, description=(
        "Extra environment of the container; not the operator's variables (EOS_*, SPARK_*, PYSPARK_*, the "
        "checkpoint's AWS keys, TMPDIR, HOME)."))
    volumes: list[dict[str, Any]] = Field(default_factory=list, max_length=32, description=(
        "Extra volumes of the Pods, as a Pod spec spells them (each with a name); the namespace's Pod Security "
        "level still applies (restricted: no hostPath)."))
    volume_mounts: list[VolumeMount] = Field(default_factory=list, max_length=32, description=(
        "Where the container mounts the extra volumes."))
    security_context: PodSecurity = Field(default_factory=PodSecurity, description=(
        "User, group and volume group of the Pods (the image's 10001 by default); the rest of the security "
        "context is fixed at the restricted Pod Security level."))

    def errors(self, field: str) -> list[str]:
        """What the operator owns and this template sets; each names the field."""
        out = [f"{field}.labels.{k}: the operator owns this label; choose another key"
               for k in self.labels if k.startswith(OWNED_LABEL_PREFIXES)]
        out += [f"{field}.env.{e.name}: the operator sets this variable; choose another name"
                for e in self.env if owned_env(e.name)]
        names = [v.get("name") for v in self.volumes]
        out += [f"{field}.volumes[{i}].name: required, a DNS label" for i, n in enumerate(names)
                if not isinstance(n, str) or not n]
        out += [f"{field}.volumes.{n}: the operator owns this volume name; choose another"
                for n in names if isinstance(n, str) and n.startswith(OWNED_VOLUMES)]
        out += [f"{field}.volumes.{n}: named twice" for n in sorted({n for n in names if names.count(n) > 1})]
        out += [f"{field}.volumeMounts.{m.name}: no volume of that name in {field}.volumes"
                for m in self.volume_mounts if m.name not in names]
        return out

    def apply(self, pod: dict) -> dict:
        """``pod`` with this template merged in; what the operator set wins."""
        meta, spec = pod["metadata"], pod["spec"]
        meta["labels"] = {**self.labels, **meta.get("labels", {})}
        if self.annotations:
            meta["annotations"] = {**self.annotations, **meta.get("annotations", {})}
        self.place(pod)
        if self.env:   # never an operator's variable, even from a spec that skipped validation
            container = spec["containers"][0]
            container["env"] = [{"name": e.name, "value": e.value} for e in self.env if not owned_env(e.name)] + \
                container.get("env", [])
        self._add_volumes(spec)
        return self.security_context.apply(pod)

    def _add_volumes(self, spec: dict) -> None:
        if self.volumes:
            spec["volumes"] = [*spec.get("volumes", []), *(dict(v) for v in self.volumes)]
        if self.volume_mounts:
            container = spec["containers"][0]
            container["volumeMounts"] = [*container.get("volumeMounts", []),
                                         *(m.model_dump(by_alias=True, exclude_none=True) for m in self.volume_mounts)]

    def spark_conf(self) -> dict[str, str]:
        """Executor settings Spark takes as configuration (labels, annotations, node selector, env)."""
        conf = {f"spark.kubernetes.executor.label.{k}": v for k, v in self.labels.items()}
        conf.update({f"spark.kubernetes.executor.annotation.{k}": v for k, v in self.annotations.items()})
        conf.update({f"spark.kubernetes.node.selector.{k}": v for k, v in self.node_selector.items()})
        conf.update({f"spark.executorEnv.{e.name}": e.value for e in self.env if not owned_env(e.name)})
        return conf

    def executor_template(self) -> dict:
        """Spark's executor pod template file: what no setting expresses (the security context, and
        tolerations, priority class, pull secrets when set). Spark builds the executor on its first
        container."""
        # An executor fetches the driver's jars and files into its working directory: the scratch volume, since
        # the image's WORKDIR is on the read-only root.
        pod = {"apiVersion": "v1", "kind": "Pod",
               "spec": {**self._pod_spec_fields(), "containers": [{"workingDir": SCRATCH_DIR}]}}
        self._add_volumes(pod["spec"])
        return self.security_context.apply(pod)
