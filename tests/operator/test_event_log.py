"""job.eventLog without Spark: the settings the runtime adds, where the log goes in each store, what validation
refuses, the folder made before Spark starts, and that a change restarts the driver. A real driver's log read
by a real History Server from S3: tests/e2e/test_s3_checkpoint.py."""
from __future__ import annotations

from eos_job import event_log
from eos_job.runtime import spark_conf_for
from eos_job.spec import ExactlyOnceStreamSpec
from eos_operator import children, upgrades
from eos_operator.validation import validate_spec

from .fakes import base_spec
from .test_driver_metrics import REF

ON = {"module": "m", "eventLog": {"enabled": True}}
S3 = {"store": "s3", "path": "/team-a/colors", "s3": {"bucket": "ckpt", "accessKeyId": {"name": "k", "key": "id"},
                                                     "secretAccessKey": {"name": "k", "key": "secret"}}}


def spec(job: dict, checkpoint: dict | None = None) -> ExactlyOnceStreamSpec:
    s = validate_spec(base_spec(job=job, **({"checkpoint": checkpoint} if checkpoint else {})))
    assert isinstance(s, ExactlyOnceStreamSpec), s
    return s


def run_conf(s: ExactlyOnceStreamSpec) -> dict[str, str]:
    return spark_conf_for(children.run_config(REF, s, tx_generation=0))


def errors(job: dict, checkpoint: dict | None = None) -> list[str]:
    res = validate_spec(base_spec(job=job, **({"checkpoint": checkpoint} if checkpoint else {})))
    assert not isinstance(res, ExactlyOnceStreamSpec), job
    return res.errors


def test_off_by_default_and_off_adds_nothing():
    default, off = spec({"module": "m"}), spec({"module": "m", "eventLog": {"dir": "/tmp/eos-test/x"}})
    assert default.job.event_log is None and "eventLog" not in default.wire()["job"]   # existing specs hash the same
    for s in (default, off):
        assert not [k for k in run_conf(s) if k.startswith("spark.eventLog.")]


def test_on_writes_a_rolling_compressed_log_beside_the_checkpoint():
    conf = event_log.spark_conf(spec(ON, S3))   # the runtime's whole conf on s3 needs the S3A jars: below, local
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == "s3a://ckpt/team-a/colors/eventlogs"    # the stream's own bucket and prefix
    assert conf["spark.eventLog.rolling.enabled"] == "true" and conf["spark.eventLog.rolling.maxFileSize"] == "128m"
    assert conf["spark.eventLog.compress"] == "true"
    local = run_conf(spec({"module": "m", "eventLog": {"enabled": True, "maxFileSizeMb": 16}}))
    assert local["spark.eventLog.dir"] == "/tmp/eos-test/eventlogs" and local[
        "spark.eventLog.rolling.maxFileSize"] == "16m"
    shared = event_log.spark_conf(spec({"module": "m", "eventLog": {"enabled": True, "dir": "/history/"}}, S3))
    assert shared["spark.eventLog.dir"] == "s3a://ckpt/history"


def test_spark_conf_may_not_move_the_log():
    for key in ("spark.eventLog.dir", "spark.eventLog.enabled", "spark.eventLog.rolling.maxFileSize",
                "spark.eventLog.compression.codec"):    # the last one is not set by the runtime, still its prefix
        errs = errors({**ON, "sparkConf": {key: "x"}})
        assert any(e.startswith(f"spec.job.sparkConf.{key}:") and "job.eventLog" in e and "remove it" in e
                   for e in errs), errs
    # Off: the user's own event log settings are theirs.
    spec({"module": "m", "sparkConf": {"spark.eventLog.enabled": "true", "spark.eventLog.dir": "/tmp/eos-test/e"}})


def test_a_dir_a_mounted_store_does_not_mount_is_refused_with_the_fix():
    errs = errors({"module": "m", "eventLog": {"enabled": True, "dir": "/elsewhere"}})
    assert any(e.startswith("spec.job.eventLog.dir:") and "outside checkpoint.path" in e for e in errs), errs
    errs = errors({"module": "m", "eventLog": {"enabled": True, "dir": "relative/x"}})
    assert any("job.eventLog.dir" in e for e in errs), errs
    errs = errors({"module": "m", "eventLog": {"enabled": True, "maxFileSizeMb": 1}})
    assert any("job.eventLog.maxFileSizeMb" in e for e in errs), errs
    spec({"module": "m", "eventLog": {"enabled": True, "dir": "/tmp/eos-test/logs"}})   # under it: fine


def test_prepare_makes_the_folder_spark_requires(tmp_path):
    s = spec({"module": "m", "eventLog": {"enabled": True}}, {"store": "local", "path": str(tmp_path / "ck")})
    event_log.prepare(s)
    assert (tmp_path / "ck" / "eventlogs").is_dir()
    event_log.prepare(spec({"module": "m"}, {"store": "local", "path": str(tmp_path / "off")}))
    assert not (tmp_path / "off").exists()


def test_an_event_log_change_restarts_on_the_live_checkpoint():
    old = upgrades.spec_json(spec({"module": "m"}))
    changes = upgrades.run_affecting_changes(old, spec(ON))
    assert changes and all(c.startswith("job.eventLog") for c in changes), changes
    assert upgrades.plan_spec_change(changes, spec(ON)).kind == "restart"
