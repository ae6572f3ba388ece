"""``python -m eos_stack.sbom [--tag IMAGE] [--out DIR]`` (PYTHONPATH=stack): the image's software bill of
materials, CycloneDX and SPDX JSON, made by Syft (``github.com/anchore/syft``, built from the Go module proxy into
the cache on first use, like the stack's other Go tools; a few minutes cold).

Syft reads the image as ``podman save`` writes it (an OCI archive): Debian's package database, every Python
distribution's metadata in the environment, and every jar's Maven coordinates (PySpark's jars, the Kafka
connector, S3A). ``make release`` runs it after the image build and lists the files in ``dist/SHA256SUMS``;
``make image`` does not (the cold build's budget). ``tests/stack/test_sbom.py`` (``make soak``) checks that the
three ecosystems are in it, with the versions the image holds.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import Stack, StackError, log
from .go_build import go_install
from .image_common import engine_env, image_under_test, podman

SYFT_VERSION = "v1.57.1"
MODULE = "github.com/anchore/syft"


def syft_bin(st: Stack) -> Path:
    return st.cache / "bin" / f"syft-{SYFT_VERSION}" / "syft"


def ensure_syft(st: Stack) -> Path:
    return go_install(st, syft_bin(st), f"{MODULE}/cmd/syft@{SYFT_VERSION}", what="sbom",
                      estimate="about 6 minutes on two cores the first time")


def file_names(tag: str) -> tuple[str, str]:
    """``<repository>-<tag>.cdx.json`` and ``.spdx.json`` for an image name."""
    base = tag.rsplit("/", 1)[-1].replace(":", "-")
    return f"{base}.cdx.json", f"{base}.spdx.json"


def make(st: Stack, tag: str, out: Path) -> tuple[Path, Path]:
    """The image's SBOM in both formats under ``out``; fails naming the missing image or Syft's error."""
    if podman(st, "image", "exists", tag, check=False).returncode != 0:
        raise StackError(f"no image {tag} in the project's container storage: run `make image` first")
    syft = ensure_syft(st)
    out.mkdir(parents=True, exist_ok=True)
    cdx, spdx = (out / n for n in file_names(tag))
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(dir=st.cache) as tmp:
        archive = Path(tmp) / "image.tar"
        podman(st, "save", "--format", "oci-archive", "-o", str(archive), tag, timeout=900)
        proc = subprocess.run([str(syft), "scan", f"oci-archive:{archive}", "--quiet",
                               "-o", f"cyclonedx-json={cdx}", "-o", f"spdx-json={spdx}"],
                              env={**engine_env(st), "SYFT_CHECK_FOR_APP_UPDATE": "false"},
                              capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise StackError(f"syft scan of {tag} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    components = len(json.loads(cdx.read_text()).get("components", []))
    log(f"sbom: {tag}: {components} components in {time.monotonic() - t0:.0f}s -> {cdx.name}, {spdx.name}")
    return cdx, spdx


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eos_stack.sbom", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default=None, help="the image (default: the one the tests use)")
    ap.add_argument("--out", type=Path, default=Path("dist"), help="the folder for the two files (default: dist)")
    args = ap.parse_args(argv)
    try:
        make(Stack(), args.tag or image_under_test(), args.out)
    except StackError as exc:
        print(f"sbom: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
