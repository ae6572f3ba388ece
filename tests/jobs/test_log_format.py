"""JSON logs of the operator and the runtime (eos_job.log_format): the fields, the context, exceptions, and
secrets never written; and one real process whose every stderr line parses as JSON."""
from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import threading
import types
from datetime import datetime
from pathlib import Path

import pytest

from eos_job import log_format
from eos_job.log_format import JsonFormatter, RedactingFormatter, log_context, redact, register_secret

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_state():
    """The module's process-wide state (base context, secrets, chosen format) as a fresh process has it."""
    saved = (dict(log_format._base), set(log_format._secrets), dict(log_format._chosen))
    log_format._base.clear()
    log_format._secrets.clear()
    yield
    log_format._base.clear()
    log_format._base.update(saved[0])
    log_format._secrets.clear()
    log_format._secrets.update(saved[1])
    log_format._chosen.update(saved[2])


def record(msg: str = "batch %d committed", *args, level=logging.INFO, exc_info=None, **extra) -> logging.LogRecord:
    if not args and msg == "batch %d committed":
        args = (7,)
    rec = logging.LogRecord("eos_job", level, __file__, 1, msg, args, exc_info)
    for k, v in extra.items():
        setattr(rec, k, v)
    return rec


def as_json(rec: logging.LogRecord) -> dict:
    line = JsonFormatter().format(rec)
    assert "\n" not in line, line
    return json.loads(line)


def test_a_record_is_one_json_object_with_time_level_logger_message():
    doc = as_json(record())
    assert list(doc) == ["time", "level", "logger", "message"]   # nothing unknown is made up
    assert (doc["level"], doc["logger"], doc["message"]) == ("INFO", "eos_job", "batch 7 committed")
    assert doc["time"].endswith("Z") and len(doc["time"]) == len("2026-11-28T11:20:00.123Z")
    parsed = datetime.fromisoformat(doc["time"].replace("Z", "+00:00"))
    assert abs(parsed.timestamp() - record().created) < 60


def test_stream_namespace_attempt_and_batch_where_known():
    log_format.set_base_context(stream="colors", namespace="team-a", attempt=3)
    doc = as_json(record())
    assert list(doc)[4:] == ["stream", "namespace", "attempt"] and "batch" not in doc
    assert (doc["stream"], doc["namespace"], doc["attempt"]) == ("colors", "team-a", 3)
    with log_context(batch=12):
        assert as_json(record())["batch"] == 12
        with log_context(batch=13, stream="other"):
            inner = as_json(record())
            assert (inner["batch"], inner["stream"]) == (13, "other")
        assert as_json(record())["batch"] == 12
    assert "batch" not in as_json(record())
    assert as_json(record(batch=99))["batch"] == 99                 # a record's own extra wins
    doc = as_json(record(k8s_ref={"kind": "ExactlyOnceSnapshot", "name": "s1", "namespace": "team-b"}))
    assert (doc["snapshot"], doc["namespace"]) == ("s1", "team-b")


def test_a_context_stays_in_its_thread():
    seen: dict[str, dict] = {}
    with log_context(batch=5):
        t = threading.Thread(target=lambda: seen.update(other=as_json(record())))
        t.start()
        t.join()
        seen["here"] = as_json(record())
    assert seen["here"]["batch"] == 5 and "batch" not in seen["other"]


def test_a_record_with_an_exception_carries_its_traceback_on_the_same_line():
    try:
        raise RuntimeError("sink unreachable\nsecond line")
    except RuntimeError:
        rec = record("batch %d failed", 4, level=logging.ERROR, exc_info=sys.exc_info())
    doc = as_json(rec)
    assert doc["level"] == "ERROR" and doc["message"] == "batch 4 failed"
    assert doc["exception"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: sink unreachable\nsecond line" in doc["exception"]


def test_secrets_never_appear_in_either_format():
    register_secret("hunter2-sasl")
    register_secret("AKIAEXAMPLEKEY")
    register_secret("id")                               # too short to be a secret: ordinary words stay
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p@ss\\"w";'
    try:
        raise ValueError("auth failed with hunter2-sasl")
    except ValueError:
        rec = record("login %s %s: %s", "AKIAEXAMPLEKEY", jaas, "id", level=logging.ERROR, exc_info=sys.exc_info())
    for text in (JsonFormatter().format(rec), RedactingFormatter(log_format.TEXT_FORMAT).format(rec)):
        assert "hunter2" not in text and "AKIAEXAMPLEKEY" not in text and "p@ss" not in text, text
        # the key and the JAAS password in the message; the secret in the traceback's source line and message
        assert text.count("***") == 4 and "ScramLoginModule required username=" in text, text
    assert redact("the id is id") == "the id is id"


def test_a_format_other_than_text_or_json_is_refused_naming_where_it_came_from():
    assert log_format.parse_format(None) == "text" and log_format.parse_format(" JSON ") == "json"
    with pytest.raises(ValueError, match=r"^EOS_LOG_FORMAT: 'xml' is not a log format: use text or json$"):
        log_format.parse_format("xml")


def test_configure_installs_one_handler_writing_the_chosen_format():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    try:
        log_format.configure("json", logging.INFO, stream=out, force=True)   # the test runner's handlers too
        logging.getLogger("eos_operator.reconciler").info("stream %s started", "colors")
        log_format.configure("text", logging.INFO, stream=out)                # replaces its own handler
        logging.getLogger("eos_operator.reconciler").info("plain")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    first, second = out.getvalue().splitlines()
    assert json.loads(first)["message"] == "stream colors started"
    assert second.endswith(" INFO eos_operator.reconciler: plain")


def test_configure_leaves_someone_elses_handlers_alone_as_basic_config_does():
    root = logging.getLogger()
    saved = list(root.handlers)
    foreign = logging.NullHandler()
    try:
        root.handlers[:] = [foreign]
        log_format.configure("json", logging.INFO)
        assert root.handlers == [foreign] and log_format.current_format() == "json"
    finally:
        root.handlers[:] = saved


def test_the_writer_logs_every_record_of_a_batch_with_its_number():
    from eos_job.writer import BatchWriter

    rec_batches = []

    class Capture(logging.Handler):
        def emit(self, rec):
            rec_batches.append(log_format.context_of(rec).get("batch"))

    log = logging.getLogger("eos_job.test-writer")
    handler = Capture()
    log.addHandler(handler)
    try:
        fake = types.SimpleNamespace(_write=lambda df, batch_id: log.warning("writing %d", batch_id))
        BatchWriter.__call__(fake, None, 41)
        log.warning("after")
    finally:
        log.removeHandler(handler)
    assert rec_batches == [41, None]


# ------------------------------------------------------------- a real process
def test_eos_job_in_json_writes_only_json_lines_to_stderr_without_its_secrets(tmp_path):
    """``python -m eos_job validate`` of a refused manifest, with a Kafka password in its environment (as
    the operator maps it into a Pod) that the manifest's refusal would print."""
    secret = "s3cr3t-hunter2"
    missing = tmp_path / secret / "stream.yaml"   # the refusal names the path, which holds the secret
    invalid = REPO / "tests" / "operator" / "invalid" / "s3-without-keys.yaml"
    env = {**os.environ, "EOS_LOG_FORMAT": "json", "EOS_SINK_SASL_PASSWORD": secret,
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in ("jobs", "operator", "stack", "."))}
    for config in (missing, invalid):
        proc = subprocess.run([sys.executable, "-m", "eos_job", "validate", "--config", str(config)], env=env,
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.splitlines()
        assert lines, "nothing on stderr"
        docs = [json.loads(line) for line in lines]        # every line is one JSON object
        assert all({"time", "level", "logger", "message"} <= set(d) for d in docs), docs
        assert secret not in proc.stderr and secret not in proc.stdout
    assert docs[-1]["level"] == "ERROR" and "checkpoint.s3.accessKeyId" in docs[-1]["message"]
    assert (docs[-1]["stream"], docs[-1]["namespace"]) == ("invalid-s3-without-keys", "default")
