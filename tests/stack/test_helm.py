"""The helm CLI of the local stack: it runs and renders a chart."""
from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path


def helm(env: dict[str, str], *args: str, tmp: Path) -> str:
    proc = subprocess.run([env["HELM"], *args], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp),
                               "HELM_CONFIG_HOME": str(tmp / "helm-config"),
                               "HELM_CACHE_HOME": str(tmp / "helm-cache"),
                               "HELM_DATA_HOME": str(tmp / "helm-data")})
    assert proc.returncode == 0, f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_helm_version(stack_env, tmp_path):
    out = helm(stack_env, "version", "--short", tmp=tmp_path)
    assert out.startswith("v3."), out


def test_helm_template_renders_a_chart(stack_env, tmp_path):
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(textwrap.dedent("""\
        apiVersion: v2
        name: hello
        version: 0.1.0
        """))
    (chart / "values.yaml").write_text("greeting: hello\nreplicas: 1\n")
    (chart / "templates" / "cm.yaml").write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: ConfigMap
        metadata:
          name: {{ .Release.Name }}-cm
          namespace: {{ .Release.Namespace }}
        data:
          greeting: {{ .Values.greeting | quote }}
          replicas: {{ .Values.replicas | quote }}
        """))
    out = helm(stack_env, "template", "demo", str(chart), "--namespace", "space",
               "--set", "greeting=bonjour", tmp=tmp_path)
    assert "name: demo-cm" in out
    assert "namespace: space" in out
    assert 'greeting: "bonjour"' in out
    assert 'replicas: "1"' in out
