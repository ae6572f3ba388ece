"""A test's streams placed on the real nodes (stack/eos_stack/node.py), in one place: ``NodeStreams.place(doc)``
rewrites a stream manifest of the tests (``streams.colors_stream``, ``Rig.stream``) for the nodes' Pods.

* the image: ``real_nodes.node_image()``, as each node's containerd holds it; ``job.podTemplate`` from
  ``real_nodes.stream_template()`` (the nodes' scheduler, the toleration of their taint);
* Kafka at the Pods' bootstrap (``POD_KAFKA_BOOTSTRAP``, the broker's listener on the stack's services address,
  which the operator on this machine reaches too);
* the checkpoint in the stack's bucket (``checkpoint.store: s3`` at ``POD_S3_ENDPOINT``) under a prefix of its
  own per test and stream, its keys in Secret ``ckpt-keys`` (``real_nodes.keys_secret``). A claim is not used:
  the stack has no provisioner, and a hostPath volume is refused under ``restricted``;
* the test job modules (``tests/e2e/jobs/*.py``, which import only pyspark, examples and eos_job): a ConfigMap
  of those files mounted through ``job.podTemplate`` volumes at ``/app/tests/e2e/jobs``. The image's working
  directory and ``PYTHONPATH`` are ``/app`` (Dockerfile), so ``tests`` and ``tests.e2e`` import there as
  namespace packages and ``tests.e2e.jobs.<module>`` as the package the ConfigMap holds. A ConfigMap rather
  than a test image layer: nothing to build or push per run, the files are the checkout's as the test runs,
  and the project's image stays the one users run;
* the driver's resources: 1 CPU and 2 GiB, as test_real_node_stream and the demo (two drivers fit the nodes).

Every e2e test's Pods run on the real nodes (the process kubelet, a test stand-in node, was retired). A real
kubelet gives a Pod only what its spec says, and a stream's ``job.podTemplate`` may not set ``EOS_*`` variables
(the operator owns them: ``eos_job.pod_template``), so a test that needs one driver's faults has the operator
under test add them to that driver's Pod (``rig(..., driver_env=...)`` in tests/e2e/streams.py).
"""
from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any, Iterator

from kubernetes import client, config

from eos_stack import node_services, s3
from eos_stack.cluster import Kubectl
from eos_stack.common import Stack
from tests.harness.node_pods import NodePods
from tests.harness.real_nodes import keys_secret, node_image, stream_template

JOBS_DIR = Path(__file__).resolve().parent / "jobs"
JOBS_CONFIGMAP = "e2e-jobs"
JOBS_MOUNT = "/app/tests/e2e/jobs"
KEYS_SECRET = "ckpt-keys"
DRIVER = {"cpu": "1", "memory": "2Gi"}


def jobs_configmap() -> dict[str, Any]:
    """The test job modules as a ConfigMap: one key per file of tests/e2e/jobs (flat: no sub-packages)."""
    files = sorted(JOBS_DIR.glob("*.py"))
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": JOBS_CONFIGMAP},
            "data": {f.name: f.read_text() for f in files}}


class NodeStreams:
    """Places a namespace's streams on the real nodes; ``setup()`` once makes the Secret and the ConfigMap."""

    def __init__(self, stack_env: dict[str, str], kubectl: Kubectl, namespace: str):
        self.env, self.kubectl, self.ns = stack_env, kubectl, namespace
        self.pod_env = node_services.pod_env(Stack())    # not .stack/env: test workers rewrite it concurrently
        self.bootstrap = self.pod_env["POD_KAFKA_BOOTSTRAP"]

    def setup(self) -> "NodeStreams":
        self.kubectl.apply(keys_secret(self.env, KEYS_SECRET), self.ns)
        self.kubectl.apply(jobs_configmap(), self.ns)
        return self

    @contextlib.contextmanager
    def pods(self, log_dir: Path) -> Iterator[NodePods]:
        """The namespace's Pods on the real nodes (``NodePods``: logs followed into ``log_dir``, ``kill9``)."""
        api = config.new_client_from_config(config_file=self.env["KUBECONFIG"])
        try:
            with NodePods(client.CoreV1Api(api), self.ns, log_dir) as pods:
                yield pods
        finally:
            api.close()

    def checkpoint(self, name: str, tag: str = "") -> dict[str, Any]:
        """``spec.checkpoint`` in the bucket, under ``/e2e/<namespace>/<name><tag>`` (a namespace is a test's)."""
        return {"store": "s3", "path": f"/e2e/{self.ns}/{name}{tag}", "s3": {
            "bucket": self.env["S3_BUCKET"], "endpoint": self.pod_env["POD_S3_ENDPOINT"], "pathStyleAccess": True,
            "accessKeyId": {"name": KEYS_SECRET, "key": "id"},
            "secretAccessKey": {"name": KEYS_SECRET, "key": "secret"}}}

    def checkpoint_files(self, name: str, under: str = "") -> list[str]:
        """The objects of stream ``name``'s checkpoint in the bucket under ``under`` (``live/offsets``), as paths
        relative to the checkpoint: read from this machine with the server's keys."""
        from pyarrow import fs
        root = f"{self.env['S3_BUCKET']}/e2e/{self.ns}/{name}"
        found = s3.filesystem(Stack()).get_file_info(fs.FileSelector(f"{root}/{under}".rstrip("/"),
                                                                     allow_not_found=True, recursive=True))
        return sorted(f.path[len(root) + 1:] for f in found)

    def place(self, doc: dict[str, Any], checkpoint_tag: str = "") -> dict[str, Any]:
        """A copy of the stream manifest ``doc`` whose Pods run on the real nodes (module docstring)."""
        doc = copy.deepcopy(doc)
        spec = doc["spec"]
        spec["source"]["bootstrapServers"] = self.bootstrap
        spec["sink"]["bootstrapServers"] = self.bootstrap
        if spec.get("checkpoint", {}).get("store", "local") == "local":
            spec["checkpoint"] = self.checkpoint(doc["metadata"]["name"], checkpoint_tag)
        job = spec.setdefault("job", {})
        job.setdefault("image", node_image())
        job.setdefault("driver", dict(DRIVER))
        template = {**stream_template(), **job.get("podTemplate", {})}
        template["volumes"] = [*template.get("volumes", []),
                               {"name": "e2e-jobs", "configMap": {"name": JOBS_CONFIGMAP}}]
        template["volumeMounts"] = [*template.get("volumeMounts", []),
                                    {"name": "e2e-jobs", "mountPath": JOBS_MOUNT, "readOnly": True}]
        job["podTemplate"] = template
        return doc
