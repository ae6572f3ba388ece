"""Spark's History Server, as docs/operations.md runs it, on loopback for a test: ``spark-class
org.apache.spark.deploy.history.HistoryServer`` of the installed PySpark, the S3A jars on
``SPARK_DIST_CLASSPATH``, its settings in ``SPARK_HISTORY_OPTS``, the bucket's keys as ``AWS_*`` (S3A's default
chain). Only its REST API is used: ``/api/v1/applications`` and an application's ``jobs``.
"""
from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

from eos_job.session import jar_list, s3a_conf
from eos_stack.common import free_port, stop_process


class HistoryServer:
    def __init__(self, log_dir: str, s3, keys: dict[str, str], log_path: Path):
        """``s3``: the stream's ``checkpoint.s3`` (endpoint, region, path style: the same S3A settings the
        driver had); ``keys``: ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``."""
        import pyspark
        self.home = Path(pyspark.__file__).parent
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api/v1"
        settings = {"spark.history.fs.logDirectory": log_dir, "spark.history.ui.port": str(self.port),
                    "spark.history.fs.update.interval": "1s",
                    **{k: v for k, v in s3a_conf(s3).items() if k.startswith("spark.hadoop.")}}
        self.env = {**os.environ, **keys, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "SPARK_DIST_CLASSPATH": ":".join(jar_list("SPARK_S3_JARS")),
                    "SPARK_HISTORY_OPTS": " ".join(f"-D{k}={v}" for k, v in settings.items()),
                    "SPARK_DAEMON_MEMORY": "512m"}
        self.log_path, self.proc = log_path, None

    def start(self) -> "HistoryServer":
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen([str(self.home / "bin" / "spark-class"),
                                          "org.apache.spark.deploy.history.HistoryServer"],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)
        return self

    def get(self, path: str):
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the History Server exited with {self.proc.returncode}:\n{self.log_tail()}")
        with urllib.request.urlopen(f"{self.url}{path}", timeout=10) as resp:
            return json.loads(resp.read())

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        stop_process(self.proc)
