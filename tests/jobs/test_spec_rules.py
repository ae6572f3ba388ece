"""The spec's rules beyond types (eos_job.spec_rules): patterns, the store a snapshot path must lie in, the sink's
topics, names, and ``eos-job validate`` on bad input (it answers with exit code 2, never a traceback)."""
from __future__ import annotations

import json
import re

import pytest
import yaml
from pydantic import ValidationError

from eos_job import spec_rules as rules
from eos_job.cli import EXIT_BAD_CONFIG, EXIT_OK, main
from eos_job.snapshot_resource import SnapshotSpec
from eos_job.spec import ExactlyOnceStreamSpec, RunConfig, StreamIdentity, semantic_errors

from .test_spec import spec

KEYS = {"accessKeyId": {"name": "keys", "key": "id"}, "secretAccessKey": {"name": "keys", "key": "secret"}}


def matches(pattern: str, value: str) -> bool:
    return re.match(pattern, value) is not None


# -------------------------------------------------------------------- patterns
@pytest.mark.parametrize("topic,ok", [("in", True), (".x", True), ("..y", True), ("...", True), ("a.b_c-d", True),
                                      (".", False), ("..", False), ("", False), ("t" * 249, True), ("t" * 250, False),
                                      ("a b", False), ("a/b", False)])
def test_topic_names_kafka_accepts(topic, ok):
    assert matches(rules.TOPIC_PATTERN, topic) is ok


@pytest.mark.parametrize("servers,ok", [
    ("localhost:9092", True), ("kafka-0.kafka.svc.cluster.local:9093,kafka-1.kafka:9093", True),
    ("10.0.0.1:1", True), ("[::1]:9092", True), ("kafka_1:65535", True),
    ("kafka", False), ("kafka:0", False), ("kafka:65536", False), ("kafka:09092", False), ("a:1, b:2", False),
    ("a:1,", False), (",a:1", False), ("PLAINTEXT://a:1", False), ("a:b", False), ("-a:1", False)])
def test_bootstrap_servers_are_host_port_lists(servers, ok):
    assert matches(rules.BOOTSTRAP_PATTERN, servers) is ok


@pytest.mark.parametrize("image,ok", [
    ("python:3.11", True), ("ghcr.io/spark-eos/spark-eos-operator:0.1.0", True), ("img:1", True),
    ("localhost:5000/team/job", True), ("registry.example.com/a__b/c-d:v1.2-rc_1", True),
    ("repo@sha256:" + "0" * 64, True), ("repo:1@sha256:" + "0" * 64, True),
    ("Team/Job:1", False), ("repo:", False), ("repo:-x", False), ("re po", False), ("repo@sha256:abc", False),
    ("/repo", False), ("repo//x", False)])
def test_image_references(image, ok):
    assert matches(rules.IMAGE_PATTERN, image) is ok


@pytest.mark.parametrize("path,ok", [
    ("/ckpt", True), ("/ckpt/streams/a-b_c.d/", True), ("/.hidden/x", True), ("/a..b", True),
    ("ckpt", False), ("./ckpt", False), ("/ckpt/../etc", False), ("/ckpt/./x", False), ("/ckpt/..", False),
    ("/", False), ("//ckpt", False), ("/a//b", False), ("/a b", False), ("/a/%2e%2e/b", False), ("/a\\b", False),
    ("file:///ckpt", False)])
def test_checkpoint_paths_are_absolute_without_dot_segments(path, ok):
    assert matches(rules.CHECKPOINT_PATH_PATTERN, path) is ok


@pytest.mark.parametrize("ref,ok", [
    ("colors-p1", True), ("colors.p1", True), ("/ckpt/snapshots/x", True), ("file:///ckpt/snapshots/x", True),
    ("s3a://bucket/streams/x", True), ("s3://bucket/x", True),
    ("../../other/exactlyoncesnapshots/x", False), ("..", False), (".", False), ("Colors", False),
    ("snapshots/x", False), ("/ckpt/../x", False), ("file://ckpt/x", False), ("s3a://bucket", False),
    ("s3a://bucket/../x", False), ("s3a://Bucket/x", False), ("http://host/x", False), ("a/b", False)])
def test_restore_from_is_a_name_or_an_absolute_location(ref, ok):
    assert matches(rules.RESTORE_FROM_PATTERN, ref) is ok
    parsed = None
    try:
        parsed = ExactlyOnceStreamSpec.model_validate(spec(restoreFrom=ref))
    except ValidationError as exc:
        assert "restoreFrom" in str(exc)
    assert (parsed is not None) is ok


def test_a_snapshot_resource_path_is_absolute_without_dot_segments():
    assert SnapshotSpec(stream="s", path="/ckpt/snapshots/x").path == "/ckpt/snapshots/x"
    for bad in ("snapshots/x", "/ckpt/../x", "s3a://b/./x"):
        with pytest.raises(ValidationError, match="path"):
            SnapshotSpec(stream="s", path=bad)


def test_over_long_strings_are_refused():
    for path, value in (("job.image", "a" * 513), ("job.module", "m" * 254), ("job.sparkConf", {"k": "v" * 4097}),
                        ("source.options", {f"k{i}": "v" for i in range(257)}),
                        ("source.bootstrapServers", ",".join(["kafka:9092"] * 50)),
                        ("checkpoint.path", "/" + "p" * 512), ("restoreFrom", "/tmp/c/" + "x" * 1020)):
        with pytest.raises(ValidationError):
            ExactlyOnceStreamSpec.model_validate(spec(**{path: value}))


# ---------------------------------------------------------------- the store
@pytest.mark.parametrize("checkpoint,location,problem", [
    ({"store": "local", "path": "/tmp/c"}, "/tmp/c/snapshots/x", None),
    ({"store": "local", "path": "/tmp/c/"}, "file:///tmp/c/snapshots/x", None),
    ({"store": "local", "path": "/tmp/c"}, "/tmp/cc/snapshots/x", "outside checkpoint.path"),
    ({"store": "pvc", "claimName": "c", "path": "/ckpt"}, "/var/lib/x", "outside checkpoint.path"),
    ({"store": "pvc", "claimName": "c", "path": "/ckpt"}, "s3a://bk1/x", "is an S3 location"),
    ({"store": "s3", "path": "/p", "s3": {"bucket": "bk1", **KEYS}}, "s3a://bk1/other/x", None),
    ({"store": "s3", "path": "/p", "s3": {"bucket": "bk1", **KEYS}}, "s3://bk1/x", None),
    ({"store": "s3", "path": "/p", "s3": {"bucket": "bk1", **KEYS}}, "s3a://bk10/x", "not in the stream's bucket"),
    ({"store": "s3", "path": "/p", "s3": {"bucket": "bk1", **KEYS}}, "/p/snapshots/x", "not in the stream's bucket"),
])
def test_a_snapshot_location_must_lie_in_the_streams_store(checkpoint, location, problem):
    s = ExactlyOnceStreamSpec.model_validate(spec(checkpoint=checkpoint))
    found = rules.store_problem(s.checkpoint, location)
    assert (found is None) if problem is None else (problem in found), found
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(checkpoint=checkpoint, restoreFrom=location)))
    assert (errors == []) if problem is None else (errors[0].startswith("restoreFrom: ") and problem in errors[0])


def test_a_snapshot_name_is_looked_up_not_checked_against_the_store():
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(restoreFrom="colors-p1"))) == []
    long_name = ".".join(["a" * 63] * 4)
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(restoreFrom=long_name)))[0].startswith(
        "restoreFrom: a snapshot name has at most 253")


# ------------------------------------------------------------------- topics
def test_the_same_cluster_is_any_shared_broker_in_any_order_and_case():
    assert rules.brokers("a:1,B:2") == rules.brokers("b:2,A:1")
    s = ExactlyOnceStreamSpec.model_validate(spec(**{"source.bootstrapServers": "k0:9092,k1:9092",
                                                     "sink.bootstrapServers": "K1:9092,k2:9092", "sink.topic": "in"}))
    errors = semantic_errors(s)
    assert len(errors) == 1 and errors[0].startswith("sink.topic: 'in' is also a source topic on the same Kafka")
    other = spec(**{"sink.bootstrapServers": "k:9093", "sink.topic": "in"})
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(other)) == []      # another cluster


def test_sink_dead_letter_and_ledger_topics_are_distinct_and_not_read():
    def errs(**sink):
        return semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(**{f"sink.{k}": v for k, v in sink.items()})),
                               "ns", "s")
    assert errs(deadLetterTopic="out")[0].startswith("sink.deadLetterTopic: must differ from sink.topic")
    assert errs(ledgerTopic="out")[0].startswith("sink.ledgerTopic: must differ from sink.topic")
    assert errs(deadLetterTopic="d", ledgerTopic="d")[0].startswith("sink.ledgerTopic: ")
    # the derived ledger topic, too
    assert errs(deadLetterTopic="out.eos-ledger.ns.s")[0].startswith("sink.deadLetterTopic: the ledger topic")
    assert errs(deadLetterTopic="in")[0].startswith("sink.deadLetterTopic: 'in' is also a source topic")
    assert errs(ledgerTopic="in")[0].startswith("sink.ledgerTopic: 'in' is also a source topic")
    assert errs(deadLetterTopic="d", ledgerTopic="l") == []


def test_the_derived_ledger_topic_must_fit_kafkas_limit():
    topic = "t" * (249 - len(".eos-ledger.ns.s"))
    s = ExactlyOnceStreamSpec.model_validate(spec(**{"sink.topic": topic}))
    assert semantic_errors(s, "ns", "s") == [] and semantic_errors(s) == []       # unknown namespace: not checked
    assert RunConfig(stream=StreamIdentity(name="s", namespace="ns", uid="u"), spec=s,
                     checkpoint_dir="/c").ledger_topic() == rules.default_ledger_topic(topic, "ns", "s")
    over = semantic_errors(s, "ns", "s2")
    assert len(over) == 1 and over[0].startswith("sink.ledgerTopic: unset") and "250 characters" in over[0]
    named = ExactlyOnceStreamSpec.model_validate(spec(**{"sink.topic": topic, "sink.ledgerTopic": "ledger"}))
    assert semantic_errors(named, "ns", "s2") == []


def test_the_crds_ledger_bound_is_the_one_of_a_one_character_namespace():
    [bound] = [r for r in rules.STREAM_OBJECT_RULES if "ledgerTopic" in r["rule"]]
    limit = int(bound["rule"].rsplit("<=", 1)[1])
    assert len(rules.default_ledger_topic("t" * (limit - 5), "n", "x" * 5)) == 249


# ---------------------------------------------------------- reserved settings
@pytest.mark.parametrize("key", ["spark.speculation", "spark.sql.shuffle.partitions", "spark.sql.adaptive.enabled",
                                 "spark.sql.streaming.checkpointFileManagerClass"])
def test_spark_settings_the_slots_rely_on_are_reserved(key):
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(**{"job.sparkConf": {key: "x"}})))
    assert len(errors) == 1 and errors[0].startswith(f"job.sparkConf.{key}:") and "remove it" in errors[0]
    cel = rules.SPARK_CONF_RULES[0]
    assert f'"{key}"' in cel["rule"] and key in cel["message"]


@pytest.mark.parametrize("prefix", rules.ENV_CONF_PREFIXES)
def test_no_spark_setting_may_set_a_runtime_variable(prefix):
    """The unsafe switches and fault hooks (eos_job.faults) are EOS_* variables: no spec reaches them through
    Spark's env settings (issue 27)."""
    key = f"{prefix}EOS_UNSAFE_DISABLE"
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(**{"job.sparkConf": {key: "ledger-skip"}})))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"job.sparkConf.{key}: sets the environment variable EOS_UNSAFE_DISABLE")
    assert "remove the key or rename the variable" in errors[0]
    cel = rules.SPARK_CONF_RULES[1]
    assert f"k.startsWith('{prefix}EOS_')" in cel["rule"]
    assert cel["message"].startswith("spec.job.sparkConf must not set an environment variable named EOS_*")
    assert f"{prefix}EOS_*" in cel["message"] and "remove the key or rename the variable" in cel["message"]


@pytest.mark.parametrize("key", ["spark.executorEnv.TZ", "spark.kubernetes.driverEnv.MY_EOS_FLAG",
                                 "spark.executorEnv.eos_lower", "spark.eos.EOS_X"])
def test_other_spark_env_settings_stay_allowed(key):
    assert semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(**{"job.sparkConf": {key: "x"}}))) == []


@pytest.mark.parametrize("key,field", sorted(rules.POD_TEMPLATE_FILE_CONF.items()))
def test_spark_pod_template_files_are_refused_naming_the_template_field(key, field):
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(**{"job.sparkConf": {key: "/x.yaml"}})))
    assert len(errors) == 1 and errors[0].startswith(f"job.sparkConf.{key}:") and f"set {field} instead" in errors[0]
    cel = rules.SPARK_CONF_RULES[2]
    assert f'"{key}"' in cel["rule"] and "use job.podTemplate and job.executor.podTemplate" in cel["message"]


@pytest.mark.parametrize("field", ["job.podTemplate", "job.executor.podTemplate"])
@pytest.mark.parametrize("name", ["EOS_UNSAFE_DISABLE", "EOS_FAULT_KILL_AFTER_COMMIT"])
def test_a_pod_template_cannot_set_a_runtime_variable(field, name):
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(
        spec(**{f"{field}.env": [{"name": name, "value": "ledger-skip"}]})))
    assert errors == [f"{field}.env.{name}: the operator sets this variable; choose another name"]


def test_the_crd_refuses_a_runtime_variable_in_a_pod_template():
    from eos_job.pod_template import EnvVar
    [cel] = EnvVar.model_json_schema()["properties"]["name"]["x-kubernetes-validations"]
    assert "self.startsWith('EOS_')" in cel["rule"] and "EOS_*" in cel["message"]
    assert cel["message"].endswith("choose another name")


@pytest.mark.parametrize("key", ["kafka.isolation.level", "subscribePattern", "assign"])
def test_source_options_the_runtime_sets_are_reserved(key):
    errors = semantic_errors(ExactlyOnceStreamSpec.model_validate(spec(**{"source.options": {key: "x"}})))
    assert len(errors) == 1 and errors[0].startswith(f"source.options.{key}:")
    [cel] = rules.SOURCE_OPTION_RULES
    assert f'"{key}"' in cel["rule"] and key in cel["message"]


# ------------------------------------------------------------ restart strategy
def test_an_initial_delay_over_the_maximum_is_refused_naming_both():
    with pytest.raises(ValidationError) as exc:
        ExactlyOnceStreamSpec.model_validate(spec(restartStrategy={
            "type": "exponential-delay", "exponentialDelay": {"initialDelaySeconds": 301}}))   # max defaults to 300
    assert "initialDelaySeconds" in str(exc.value) and "maxDelaySeconds" in str(exc.value)
    ok = {"type": "exponential-delay", "exponentialDelay": {"initialDelaySeconds": 300, "maxDelaySeconds": 300}}
    assert ExactlyOnceStreamSpec.model_validate(spec(restartStrategy=ok))


# --------------------------------------------------------------------- names
@pytest.mark.parametrize("meta,snapshot,ok", [
    ({"name": "colors"}, False, True), ({"name": "n" * 56, "namespace": "team-a"}, False, True),
    ({"name": "n" * 57}, False, False), ({"name": "1-colors"}, False, False), ({"name": "colors.v2"}, False, False),
    ({"name": "Colors"}, False, False), ({}, False, False), (None, False, False),
    ({"name": "colors", "namespace": "Team_A"}, False, False),
    ({"name": "colors-p1.x"}, True, True), ({"name": "s" * 63}, True, True), ({"name": "s" * 64}, True, False),
    ({"name": "-s"}, True, False)])
def test_metadata_names_follow_the_crds(meta, snapshot, ok):
    assert (rules.name_errors(meta, snapshot=snapshot) == []) is ok


def test_name_limits_agree_with_the_operators():
    from eos_operator.children import MAX_LABEL, MAX_STREAM_NAME
    assert (rules.MAX_STREAM_NAME, rules.MAX_SNAPSHOT_NAME) == (MAX_STREAM_NAME, MAX_LABEL)


# ------------------------------------------------------------ eos-job validate
def validate(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code = main(["validate", "--config", str(path)])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out + out.err


def manifest(**meta) -> str:
    return yaml.safe_dump({"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceStream",
                           "metadata": {"name": "colors", **meta}, "spec": spec()})


def test_validate_accepts_a_good_stream(tmp_path, capsys):
    assert validate(tmp_path, capsys, manifest()) == (EXIT_OK, "config for stream default/colors is valid\n")


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(" " * i + "- \n" for i in range(3000)),
                                  "{a: " * 3000 + "1" + "}" * 3000])
def test_validate_refuses_deep_nesting_with_its_bad_config_code(tmp_path, capsys, text):
    code, out = validate(tmp_path, capsys, text)
    assert code == EXIT_BAD_CONFIG and "nested too deeply" in out


def test_validate_refuses_deep_nesting_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("EOS_TEST_CONFIG", "[" * 100_000 + "]" * 100_000)
    assert main(["validate", "--config-env", "EOS_TEST_CONFIG"]) == EXIT_BAD_CONFIG
    assert "nested too deeply" in capsys.readouterr().err


@pytest.mark.parametrize("text,says", [("- a\n", "expected a mapping"), ("just text", "expected a mapping"),
                                       ("kind: Deployment\nmetadata: {name: x}\n", "kind: 'Deployment' is not")])
def test_validate_refuses_what_is_not_a_stream(tmp_path, capsys, text, says):
    code, out = validate(tmp_path, capsys, text)
    assert code == EXIT_BAD_CONFIG and says in out


@pytest.mark.parametrize("meta,says", [({"name": "n" * 57}, "at most 56"), ({"name": "colors.v2"}, "DNS-1035"),
                                       ({"namespace": "Team_A"}, "metadata.namespace")])
def test_validate_applies_the_crds_name_rules(tmp_path, capsys, meta, says):
    code, out = validate(tmp_path, capsys, manifest(**meta))
    assert code == EXIT_BAD_CONFIG and says in out


def test_validate_checks_the_derived_ledger_topic_in_the_manifests_namespace(tmp_path, capsys):
    doc = yaml.safe_load(manifest(namespace="a-long-team-namespace"))
    doc["spec"]["sink"]["topic"] = "t" * 220
    code, out = validate(tmp_path, capsys, yaml.safe_dump(doc))
    assert code == EXIT_BAD_CONFIG and "sink.ledgerTopic: unset" in out


def test_validate_checks_a_snapshot_manifest_as_a_snapshot(tmp_path, capsys):
    snap = {"apiVersion": "streaming.eos.dev/v1beta1", "kind": "ExactlyOnceSnapshot",
            "metadata": {"name": "colors-p1"}, "spec": {"stream": "colors", "path": "/ckpt/snapshots/p1"}}
    code, out = validate(tmp_path, capsys, yaml.safe_dump(snap))
    assert code == EXIT_OK and "snapshot manifest default/colors-p1 is valid" in out
    bad = {**snap, "metadata": {"name": "s" * 64}, "spec": {"stream": "colors", "path": "../../etc"}}
    code, out = validate(tmp_path, capsys, yaml.safe_dump(bad))
    assert code == EXIT_BAD_CONFIG and "invalid snapshot manifest" in out
    assert "metadata.name" in out and "spec.path: must be an absolute path" in out and "source" not in out
    code, out = validate(tmp_path, capsys, yaml.safe_dump({**snap, "spec": None}))
    assert code == EXIT_BAD_CONFIG and "spec" in out


def test_run_refuses_a_snapshot_manifest_clearly(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"kind": "ExactlyOnceSnapshot", "metadata": {"name": "p1"}, "spec": {"stream": "c"}}))
    assert main(["resolve", "--config", str(path)]) == EXIT_BAD_CONFIG
    assert "this is an ExactlyOnceSnapshot manifest: eos-job resolve takes an ExactlyOnceStream manifest" in \
        capsys.readouterr().err


def test_validate_says_what_a_pattern_wants(tmp_path, capsys):
    doc = yaml.safe_load(manifest())
    doc["spec"]["source"]["bootstrapServers"] = "kafka"
    code, out = validate(tmp_path, capsys, yaml.safe_dump(doc))
    assert code == EXIT_BAD_CONFIG and "source.bootstrapServers: not a broker list: write host:port" in out
