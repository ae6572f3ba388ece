{{/*
The operator's permissions: exactly the Kubernetes API calls of operator/eos_operator
(adapters.KubernetesApi) and of kopf as handlers.py configures it. No wildcards.
tests/chart/test_rbac.py checks each verb below against the calls the code makes,
and that removing any one of them denies a call the operator needs.

Not granted, on purpose:
  - secrets list/watch: the operator reads only the Secrets a stream names, by name
    (get below); the driver Pod reads the sink credentials through secretKeyRef.
  - namespaces list/watch: the operator runs --all-namespaces or with exact names;
    kopf needs namespace listing only to expand globs (it logs a warning and uses
    the exact names when it may not list them).
  - kopfpeerings/clusterkopfpeerings: the operator runs standalone, never with
    --peering; replicas elect a leader through a Lease (leader-rbac.yaml).
  - pods get/patch/update: the operator's Pods are read from a watch of the label
    app.kubernetes.io/managed-by=eos-operator (informer.py) and never changed.
  - exactlyoncesnapshots update, exactlyoncesnapshots/finalizers: a snapshot's Pods
    reference it with blockOwnerDeletion: false (snapshots.SnapshotRef), and only
    its status is ever written.
  - events update: a repeated event is counted with a merge patch (events.py).
*/}}
{{- define "eos.operatorRules" -}}
# The ExactlyOnceStream resource:
#   list, watch: kopf's watch stream of the resource (handlers.RESOURCE), and the
#          operator's own (informer.py: every pass reads the stream from it).
#   get:   a stream its watch has not shown yet (just created), or after a status patch
#          refused as stale (informer.WatchedKube.get_stream); passes read the watch.
#   patch: kopf adds/removes its finalizer (streaming.eos.dev/finalizer) and keeps its
#          progress and last-handled-configuration in annotations (handlers.configure).
- apiGroups: ["streaming.eos.dev"]
  resources: ["exactlyoncestreams"]
  verbs: ["get", "list", "watch", "patch"]
# The status is the reconciler's write-ahead log: a merge patch of the /status
# subresource carrying the observed resourceVersion (adapters.patch_stream_status).
- apiGroups: ["streaming.eos.dev"]
  resources: ["exactlyoncestreams/status"]
  verbs: ["patch"]
# Children carry an owner reference with blockOwnerDeletion: true (children.StreamRef).
# Clusters with the OwnerReferencesPermissionEnforcement admission plugin (e.g.
# OpenShift) refuse such a child unless its creator may update the owner's finalizers.
# It adds nothing to `patch` above, which can already set metadata.finalizers.
- apiGroups: ["streaming.eos.dev"]
  resources: ["exactlyoncestreams/finalizers"]
  verbs: ["update"]
# The ExactlyOnceSnapshot resource (snapshot_planner.py, snapshot_reconciler.py):
#   list, watch: kopf's watch stream of snapshots (handlers.SNAPSHOT_RESOURCE), and the
#          operator's own (informer.py), which answers a stream's snapshots by label.
#   get:   a snapshot its watch has not shown yet, or after a stale status patch
#          (informer.WatchedKube.get_snapshot); passes read the watch.
#   create, delete: snapshots the operator takes for a stream (periodic, snapshotNonce,
#          upgrade) and their retention (adapters.create_snapshot, delete_snapshot).
#   patch: kopf's finalizer, which holds a deleted snapshot until its files are
#          disposed, and its annotations (handlers.configure).
- apiGroups: ["streaming.eos.dev"]
  resources: ["exactlyoncesnapshots"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# The snapshot's status: its write-ahead log (adapters.patch_snapshot_status).
- apiGroups: ["streaming.eos.dev"]
  resources: ["exactlyoncesnapshots/status"]
  verbs: ["patch"]
# Driver Pods: list and watch by label (informer.py: the operator's Pods, one watch;
# a Pod by name on a 409 with a list), create with a deterministic name (409 = already
# there), delete with a grace period (stop, restart, upgrade). The same for a snapshot's
# Pods: take, inspect and dispose (snapshot_reconciler).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "create", "delete"]
# The run ConfigMap (<stream>-run) and, in cluster deploy mode, the headless driver
# Service (<stream>-driver): create; on 409 get the current object and update
# (replace) it; delete when the stream stops or is deleted (adapters._apply, _delete).
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "update", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "update", "delete"]
# Events on the stream and on snapshots (adapters.post_event): create, and patch to count the same
# event again on the first one (events.py). kopf posts none of its own (settings.posting.enabled is off
# in handlers.configure).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/*
Secrets: get by name only, the keys a stream names in its own namespace (adapters.secret_value):
the S3 keys of checkpoint.s3 (the operator reads that checkpoint straight from the bucket for
resolution, snapshot manifests and upgrade checks) and the Kafka credentials and TLS material of
source and sink (the operator's own Kafka clients fence and read the ledger). Never listed, watched
or kept beyond the read. Granted in every watched namespace (watchNamespaces set); in a cluster-wide
install only in the namespaces of rbac.secretNamespaces (a Role each), or everywhere with
rbac.secretsClusterWide: true (opt-in: the operator could then read any Secret it is told the name of).
*/}}
{{- define "eos.secretRules" -}}
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get"]
{{- end -}}

{{/*
Cluster-wide only: kopf watches CustomResourceDefinitions to notice the
ExactlyOnceStream and ExactlyOnceSnapshot CRDs being created or changed while it runs (kopf
reactor/observation.resource_observer); read-only. In namespaced mode no
cluster-scoped permission is created: kopf then discovers the resource once at
start (the CRD is installed before the operator by Helm's crds/) and logs a warning.
*/}}
{{- define "eos.operatorClusterOnlyRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# Nodes, get by name only: the Node of a driver Pod that looks unwell (not Ready, or being deleted), to tell a
# lost node from a slow Pod (docs/operations.md#node-loss). A namespaced install (watchNamespaces) grants nothing
# cluster-wide: its operator cannot tell, and waits for such a Pod to go as before.
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get"]
{{- end -}}

{{/*
The driver Pod's permissions in cluster deploy mode (spark-submit --master k8s://,
the Pod is the driver, executors are Pods): Spark's Kubernetes scheduler backend
gets its own Pod (spark.kubernetes.driver.pod.name, to own the executors), creates,
watches, polls, labels and deletes executor Pods, creates and deletes the executor
ConfigMap (spark-exec-*-conf-map), on-demand PVCs (spark.kubernetes.executor.volumes.
persistentVolumeClaim.*.options.claimName=OnDemand) and, for spark-submit's own
cluster mode, the driver Service. The same verb set as kubeflow/spark-operator's
chart grants its spark ServiceAccount, limited to these four resources and spelled out.
*/}}
{{- define "eos.jobRules" -}}
- apiGroups: [""]
  resources: ["pods", "services", "configmaps", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
{{- end -}}
