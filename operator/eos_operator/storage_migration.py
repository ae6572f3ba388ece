"""``kubectl eos migrate-storage``: rewrite every stored stream and snapshot in the CRDs' storage version.

The API server stores an object in the version that was the storage version when the object was last written,
and keeps it so until it is written again: after the CRDs moved to v1beta1, streams created under v1alpha1
are still v1alpha1 in etcd, and the CRD lists both in ``status.storedVersions``. A later release can stop
serving v1alpha1 only once nothing is stored in it. This is the storage version migration Kubernetes documents
(and kube-storage-version-migrator automates): for each CRD,

1. check that its storage version is the one wanted (else the new CRDs are not applied yet: refuse);
2. list every object in every namespace and update each one unchanged (a PUT of the object as read, with its
   resourceVersion): the API server encodes it again, in the storage version, and writes it. A 409 means
   someone wrote it meanwhile, which stored it in the storage version too; a 404 means it is gone;
3. only if every object was rewritten, set ``status.storedVersions`` to the storage version alone.

An object written while this runs is stored in the storage version whatever version the writer spoke, so
nothing can be left behind between steps 2 and 3. Idempotent: run it again after a failure. Spec and status
are not changed (the update goes to the main resource, which ignores status), the ``metadata.generation`` does
not move (no spec change), so the operator does not restart anything.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from eos_job.snapshot_resource import SNAPSHOT_PLURAL
from eos_job.spec import API_GROUP, API_VERSION, PLURAL

from .kube_errors import KubeError

CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PLURALS = (PLURAL, SNAPSHOT_PLURAL)
Request = Callable[..., Any]   # KubernetesApi.request_sync: (method, path, body=None, query=None, content_type=...)


class MigrationRefused(Exception):
    """The CRD is not in a state where migrating makes sense (missing, or not yet storing the wanted version)."""


@dataclass
class CrdMigration:
    crd: str
    storage_version: str
    stored_before: list[str]
    rewritten: list[str] = field(default_factory=list)     # namespace/name
    failed: list[str] = field(default_factory=list)        # "namespace/name: why"
    stored_after: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return not self.failed and self.stored_after == [self.storage_version]

    def summary(self) -> str:
        if self.stored_before == [self.storage_version] and not self.rewritten:
            return f"{self.crd}: stored versions already [{self.storage_version}], nothing to do"
        text = (f"{self.crd}: {len(self.rewritten)} object(s) rewritten in {self.storage_version}; stored versions "
                f"{self.stored_before} -> {self.stored_after}")
        if self.failed:
            text += (f"; {len(self.failed)} could not be rewritten, so the stored versions were left as they were "
                     f"(fix them and run `kubectl eos migrate-storage` again): " + "; ".join(self.failed))
        return text


def storage_version(crd: dict[str, Any]) -> str:
    return next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))


def _rewrite(request: Request, path: str, obj: dict[str, Any]) -> str | None:
    """Write ``obj`` back unchanged; None if it is now stored in the storage version, else why not."""
    for _ in range(5):
        try:
            request("PUT", path, obj)
            return None
        except KubeError as exc:
            if exc.status == 404:
                return None                  # deleted meanwhile: nothing stored
            if exc.status != 409:
                return exc.message
        # 409: written by someone else since the read, i.e. stored in the storage version already; read it
        # again and write anyway, which costs one write and proves it.
        try:
            obj = request("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            return exc.message
    return "kept changing under five attempts to rewrite it"


def _every(request: Request, path: str, page_size: int = 500):
    """Every object of a cluster-wide list, page by page (a large cluster's list is not one answer)."""
    token = None
    while True:
        query = {"limit": str(page_size), **({"continue": token} if token else {})}
        page = request("GET", path, None, query) or {}
        yield from page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return


def migrate_crd(request: Request, crd_name: str, *, want: str = API_VERSION) -> CrdMigration:
    try:
        crd = request("GET", f"{CRD_API}/{crd_name}")
    except KubeError as exc:
        if exc.status == 404:
            raise MigrationRefused(f"CRD {crd_name} is not installed: apply the chart's crds/ first") from None
        raise
    version = storage_version(crd)
    if version != want:
        raise MigrationRefused(f"CRD {crd_name} stores {version}, not {want}: apply the new CRDs "
                               f"(`kubectl apply --server-side -f charts/spark-eos-operator/crds/`) and run again")
    result = CrdMigration(crd_name, version, list((crd.get("status") or {}).get("storedVersions") or []))
    if result.stored_before == [version]:
        result.stored_after = [version]
        return result
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    base = f"/apis/{group}/{version}"
    for obj in _every(request, f"{base}/{plural}"):
        meta = obj["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        why = _rewrite(request, f"{base}/namespaces/{meta['namespace']}/{plural}/{meta['name']}", obj)
        if why is None:
            result.rewritten.append(key)
        else:
            result.failed.append(f"{key}: {why}")
    if result.failed:
        result.stored_after = result.stored_before
        return result
    patched = request("PATCH", f"{CRD_API}/{crd_name}/status", {"status": {"storedVersions": [version]}},
                      content_type="application/merge-patch+json")
    result.stored_after = list(((patched or {}).get("status") or {}).get("storedVersions") or [])
    return result


def migrate_storage(request: Request, crd_names: Iterable[str] | None = None, *,
                    want: str = API_VERSION) -> list[CrdMigration]:
    """Migrate the project's CRDs (or ``crd_names``); one result per CRD."""
    names = list(crd_names) if crd_names is not None else [f"{p}.{API_GROUP}" for p in PLURALS]
    return [migrate_crd(request, name, want=want) for name in names]


def add_parser(sub) -> None:
    p = sub.add_parser("migrate-storage", help="rewrite every stream and snapshot in the storage version (v1beta1) "
                                               "and drop older versions from the CRDs' status.storedVersions")
    p.add_argument("--crd", action="append", dest="crds", metavar="NAME",
                   help=f"only this CRD (repeatable; default: {', '.join(f'{p}.{API_GROUP}' for p in PLURALS)})")


def run(args, emit) -> int:
    """``kubectl eos migrate-storage``: 0 when every CRD stores its storage version alone, else 1."""
    from .kube_api import KubernetesApi

    api = KubernetesApi.from_kubeconfig(args.kubeconfig, args.context, threads=1)
    try:
        results = migrate_storage(api.request_sync, args.crds)
    except MigrationRefused as exc:
        print(f"kubectl eos migrate-storage: {exc}", file=sys.stderr)
        return 1
    doc = {"items": [{"crd": r.crd, "storageVersion": r.storage_version, "storedVersionsBefore": r.stored_before,
                      "storedVersionsAfter": r.stored_after, "rewritten": r.rewritten, "failed": r.failed}
                     for r in results]}
    emit(doc, args.output, lambda: "\n".join(r.summary() for r in results))
    return 0 if all(r.done for r in results) else 1
