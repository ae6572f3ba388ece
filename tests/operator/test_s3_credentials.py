"""Whose identity reads a stream's bucket (issue 30): the keys of its Secret, or, chosen explicitly with
``checkpoint.s3.credentials: ambient`` and allowed by the operator, the operator's own; never the operator's
own by omission. The CEL rules saying the same are checked on the real API server by the invalid corpus
(tests/operator/invalid/s3-*.yaml, test_validation.py)."""
from __future__ import annotations

import asyncio

import pytest

from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator.adapters import StoreUnreadable, s3_options
from eos_operator.cli import _parser
from eos_operator.reconciler import Deps, reconcile
from eos_operator.upgrades import classify, plan_spec_change, run_affecting_changes, spec_json
from eos_operator.validation import InvalidSpec, allow_ambient_s3_credentials, ambient_s3_allowed, validate_spec

from .fakes import FakeClock, FakeKube, FakeResolver, base_spec

KEYS = {"accessKeyId": {"name": "keys", "key": "id"}, "secretAccessKey": {"name": "keys", "key": "secret"}}
BUCKET = {"bucket": "ckpt", "endpoint": "http://minio:9000", "pathStyleAccess": True}


def s3_spec(**s3) -> dict:
    return base_spec(checkpoint={"store": "s3", "path": "/streams/colors", "s3": {**BUCKET, **s3}})


@pytest.fixture
def ambient():
    """Sets whether this operator allows ambient credentials; off again afterwards (its default)."""
    yield allow_ambient_s3_credentials
    allow_ambient_s3_credentials(False)


def test_the_operator_refuses_ambient_credentials_unless_started_to_allow_them():
    assert ambient_s3_allowed() is False                       # the default of a process that did not choose
    assert _parser().parse_args(["run"]).allow_ambient_s3_credentials is False
    assert _parser().parse_args(["run", "--allow-ambient-s3-credentials"]).allow_ambient_s3_credentials is True


def test_keys_are_required_unless_ambient_is_chosen(ambient):
    ambient(True)    # even an operator that allows ambient credentials does not take them by omission
    result = validate_spec(s3_spec())
    assert isinstance(result, InvalidSpec)
    (error,) = result.errors
    assert error.startswith("spec.checkpoint.s3.accessKeyId: required with checkpoint.store s3 unless "
                            "checkpoint.s3.credentials is ambient"), error
    assert "credentials: ambient" in error and "operator.allowAmbientS3Credentials" in error
    for explicit in ({"credentials": "secret"}, {}):
        assert isinstance(validate_spec(s3_spec(**explicit, **KEYS)), ExactlyOnceStreamSpec)
    assert isinstance(validate_spec(s3_spec(credentials="secret")), InvalidSpec)


def test_ambient_with_keys_is_refused(ambient):
    ambient(True)
    result = validate_spec(s3_spec(credentials="ambient", **KEYS))
    assert isinstance(result, InvalidSpec)
    assert result.errors == ("spec.checkpoint.s3.credentials: ambient reads the bucket without keys, but "
                             "accessKeyId or secretAccessKey is set: remove the keys, or set credentials secret "
                             "(or leave it unset)",)


def test_ambient_is_invalid_on_an_operator_that_does_not_allow_it_naming_the_chart_value(ambient):
    ambient(False)
    result = validate_spec(s3_spec(credentials="ambient"))
    assert isinstance(result, InvalidSpec)
    (error,) = result.errors
    assert error.startswith("spec.checkpoint.s3.credentials: ambient would read the bucket with the operator's "
                            "own identity, and this operator does not allow it"), error
    assert "operator.allowAmbientS3Credentials" in error and "--allow-ambient-s3-credentials" in error
    ambient(True)
    spec = validate_spec(s3_spec(credentials="ambient"))
    assert isinstance(spec, ExactlyOnceStreamSpec) and spec.checkpoint.s3.credentials == "ambient"


def test_ambient_on_another_store_is_not_an_operator_identity(ambient):
    """credentials is about an S3 store; a pvc stream's leftover s3 section reads nothing."""
    ambient(False)
    spec = base_spec(checkpoint={"store": "pvc", "claimName": "c", "path": "/ckpt",
                                 "s3": {"bucket": "ckpt", "credentials": "ambient"}})
    assert isinstance(validate_spec(spec), ExactlyOnceStreamSpec)


def options(raw: dict) -> object:
    kube = FakeKube()
    kube.secrets[("default", "keys")] = {"data": {"id": "aWQ=", "secret": "aHVudGVyMg=="}}
    spec = ExactlyOnceStreamSpec.model_validate(raw)
    try:
        return asyncio.run(s3_options(kube, "default", spec)), kube.secret_reads
    except StoreUnreadable as exc:
        return exc, kube.secret_reads


def test_the_store_reader_never_uses_its_own_identity_unless_ambient_is_chosen_and_allowed(ambient):
    # Parsed past validation (as a spec from an older operator's status could be): the adapter refuses too.
    ambient(True)
    refused, reads = options(s3_spec())
    assert isinstance(refused, StoreUnreadable) and reads == []
    assert "does not read the bucket with its own identity" in str(refused)
    ambient(False)
    refused, reads = options(s3_spec(credentials="ambient"))
    assert isinstance(refused, StoreUnreadable) and "operator.allowAmbientS3Credentials" in str(refused)
    ambient(True)
    opts, reads = options(s3_spec(credentials="ambient"))
    assert (opts.access_key, opts.secret_key, opts.endpoint, opts.path_style) == (None, None, "http://minio:9000",
                                                                                    True)
    assert reads == []                                        # no Secret is read for an ambient stream
    opts, reads = options(s3_spec(**KEYS))
    assert (opts.access_key, opts.secret_key) == ("id", "hunter2") and reads == [("default", "keys")] * 2
    assert "hunter2" not in repr(opts)


def reconcile_once(raw: dict):
    kube, clock = FakeKube(), FakeClock()
    resolver = FakeResolver(kube=kube)
    kube.add_stream("colors", raw)
    asyncio.run(reconcile("default", "colors", Deps(kube=kube, resolver=resolver, clock=clock)))
    status = kube.stream("colors").get("status") or {}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    return kube, resolver, status, ready


def test_the_reconciler_refuses_a_keyless_stream_instead_of_reading_its_bucket_as_itself(ambient):
    """A manifest written before credentials existed (no keys): InvalidSpec naming the field and the fix;
    no resolution (which would read the bucket), no Pod, no Secret read."""
    ambient(True)
    kube, resolver, status, ready = reconcile_once(s3_spec())
    assert status["lifecycleState"] == "Invalid" and ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.checkpoint.s3.accessKeyId: required"), ready
    assert kube.reasons() == ["InvalidSpec"]
    assert kube.created_pods == [] and resolver.calls == [] and kube.secret_reads == []


def test_the_reconciler_refuses_ambient_on_an_operator_that_does_not_allow_it(ambient):
    ambient(False)
    kube, resolver, status, ready = reconcile_once(s3_spec(credentials="ambient"))
    assert ready["reason"] == "InvalidSpec" and "operator.allowAmbientS3Credentials" in ready["message"]
    assert kube.created_pods == [] and resolver.calls == []


def test_the_reconciler_runs_an_allowed_ambient_stream_without_keys(ambient):
    ambient(True)
    kube, resolver, status, ready = reconcile_once(s3_spec(credentials="ambient"))
    assert ready["reason"] != "InvalidSpec", ready
    assert len(resolver.calls) == 1 and resolver.s3 is not None and resolver.s3.access_key is None
    assert kube.created_pods == ["colors-driver-0"] and kube.secret_reads == []
    env = {e["name"] for e in kube.pods[("default", "colors-driver-0")]["spec"]["containers"][0]["env"]}
    assert "AWS_ACCESS_KEY_ID" not in env and "EOS_S3_ENDPOINT" in env   # the Pod's own identity reads it


def test_choosing_ambient_for_a_keyless_stream_is_a_restart_not_an_upgrade():
    """The migration of a keyless stream (add credentials: ambient) changes no location, so no snapshot."""
    assert classify("checkpoint.s3.credentials") == "restart"
    old = ExactlyOnceStreamSpec.model_validate(s3_spec())               # as a keyless stream ran before 0.1.0
    new = ExactlyOnceStreamSpec.model_validate(s3_spec(credentials="ambient"))
    changes = run_affecting_changes(spec_json(old), new)
    assert changes == ["checkpoint.s3.credentials"]
    assert plan_spec_change(changes, new).kind == "restart"
    assert classify("checkpoint.s3.accessKeyId") == "upgrade"   # unchanged: another Secret may be another bucket

