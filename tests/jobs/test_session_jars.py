"""Where the runtime finds its jars: ``SPARK_JARS`` / ``SPARK_S3_JARS``, else the image's jar folders.

A driver Pod names a ``command`` (``python -m eos_job run``), which replaces the image's entrypoint, the
script that lists the folders into the variables: found by running the driver Pod as a container of the image
(the Kafka source was then missing: "Failed to find data source: kafka")."""
from __future__ import annotations

from eos_job.session import jar_list


def test_the_variable_wins_and_is_split_on_commas(tmp_path):
    (tmp_path / "x.jar").write_text("")
    env = {"SPARK_JARS": "/a.jar,/b.jar", "EOS_JARS_DIR": str(tmp_path)}
    assert jar_list("SPARK_JARS", env) == ["/a.jar", "/b.jar"]


def test_without_the_variable_every_jar_of_the_image_folder(tmp_path):
    for name in ("spark-sql-kafka.jar", "kafka-clients.jar", "README"):
        (tmp_path / name).write_text("")
    assert jar_list("SPARK_JARS", {"EOS_JARS_DIR": str(tmp_path)}) == [
        str(tmp_path / "kafka-clients.jar"), str(tmp_path / "spark-sql-kafka.jar")]
    assert jar_list("SPARK_S3_JARS", {"EOS_S3_JARS_DIR": str(tmp_path), "EOS_JARS_DIR": "/nowhere"}) == [
        str(tmp_path / "kafka-clients.jar"), str(tmp_path / "spark-sql-kafka.jar")]


def test_neither_gives_no_jars():
    assert jar_list("SPARK_JARS", {}) == []
    assert jar_list("SPARK_S3_JARS", {"SPARK_JARS": "/a.jar"}) == []


def test_the_jvm_slot_writers_jar_goes_on_spark_jars_only_when_it_exists(tmp_path):
    from eos_job.session import writer_jars
    jar = tmp_path / "eos-slot-writer.jar"
    assert writer_jars({"EOS_SLOT_WRITER_JAR": str(jar)}) == []      # named but absent: not listed
    jar.write_bytes(b"PK")
    assert writer_jars({"EOS_SLOT_WRITER_JAR": str(jar)}) == [str(jar)]
    assert writer_jars({}) == []
