"""One storage layer for checkpoints and snapshots: local files and S3, through ``pyarrow.fs``.

A location is a string as Spark takes it: a local path (``/data/ckpt``, ``file:///data/ckpt``) or an
object-store URI (``s3a://bucket/prefix/ckpt``). ``Loc.of`` turns it into a ``Loc``, a small Path-like
handle whose methods behave the same on both (``exists``, ``iterdir``, ``read_text``, ...), so the code
that reads Spark's checkpoint (``checkpoint``) and copies it (``snapshot``) is written once.

What differs, and how this module deals with it:

* S3 has no directories: a "folder" exists while an object has its prefix; ``mkdir`` does nothing there.
* S3 has no rename: ``write_text`` is a single PUT (an object appears whole or not at all), and a
  snapshot is complete when its manifest, written last, exists (``snapshot``), not after a rename.
* Copies stay on the server: ``copy_to`` is a CopyObject on S3 (no bytes through this process).

Endpoint, region and addressing style of a bucket come from ``register_s3`` (the stream's
``checkpoint.s3``, set up by ``configure``) or else from ``EOS_S3_*`` variables (``env_options``); the
credentials from ``AWS_ACCESS_KEY_ID`` and ``AWS_SECRET_ACCESS_KEY``, which the operator maps into the
stream's Pods from its Secret.
"""
from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import PurePosixPath

from pyarrow import fs as pafs

S3_SCHEMES = ("s3a://", "s3://")


@dataclass(frozen=True)
class S3Options:
    endpoint: str | None = None        # http(s)://host:port; None: AWS's own endpoint for the region
    region: str = "us-east-1"
    path_style: bool = False
    # Explicit keys (the operator, from the stream's Secret); None: the environment's. Never printed.
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)


_buckets: dict[str, S3Options] = {}


def register_s3(bucket: str, options: S3Options) -> None:
    """How to reach ``bucket`` (endpoint, region, addressing); the credentials come from the environment."""
    _buckets[bucket] = options


def env_options(env=os.environ) -> S3Options:
    """A bucket nobody registered: ``EOS_S3_ENDPOINT``, ``EOS_S3_REGION`` and ``EOS_S3_PATH_STYLE``, which the
    operator sets in every Pod of a stream with ``store: s3`` (snapshot and pre-flight Pods load no spec)."""
    return S3Options(endpoint=env.get("EOS_S3_ENDPOINT") or None, region=env.get("EOS_S3_REGION") or "us-east-1",
                     path_style=env.get("EOS_S3_PATH_STYLE", "").lower() == "true")


def configure(checkpoint_spec) -> None:
    """Register the bucket of a stream's ``checkpoint`` (``store: s3``); nothing to do for other stores."""
    s3 = getattr(checkpoint_spec, "s3", None)
    if checkpoint_spec.store == "s3" and s3 is not None:
        register_s3(s3.bucket, S3Options(endpoint=s3.endpoint, region=s3.region, path_style=s3.path_style_access))


def is_object_store(location: str) -> bool:
    return location.startswith(S3_SCHEMES)


@lru_cache(maxsize=16)
def _s3(options: S3Options, access_key: str | None, secret_key: str | None) -> pafs.FileSystem:
    kwargs: dict = {"region": options.region, "force_virtual_addressing": not options.path_style,
                    "connect_timeout": 5, "request_timeout": 30}
    if options.endpoint:
        scheme, _, host = options.endpoint.partition("://")
        kwargs.update(endpoint_override=host.rstrip("/"), scheme=scheme)
    if access_key and secret_key:
        kwargs.update(access_key=access_key, secret_key=secret_key)
    return pafs.S3FileSystem(**kwargs)


def _filesystem(location: str, s3: S3Options | None = None) -> tuple[pafs.FileSystem, str]:
    if is_object_store(location):
        rest = location.split("://", 1)[1]
        bucket = rest.split("/", 1)[0]
        rest = rest.rstrip("/")
        if not bucket:
            raise ValueError(f"{location!r}: an S3 location needs a bucket (s3a://<bucket>/<prefix>)")
        options = s3 or _buckets.get(bucket) or env_options()
        if options.access_key and options.secret_key:
            return _s3(options, options.access_key, options.secret_key), rest
        return _s3(options, os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")), rest
    path = location.removeprefix("file://")
    return pafs.LocalFileSystem(), os.path.abspath(path)


class Loc:
    """A file or folder in a store; immutable, cheap, compared by its URI."""

    __slots__ = ("fs", "path", "scheme")

    def __init__(self, filesystem: pafs.FileSystem, path: str, scheme: str):
        self.fs, self.path, self.scheme = filesystem, path, scheme

    @classmethod
    def of(cls, location: "str | os.PathLike | Loc", s3: S3Options | None = None) -> "Loc":
        """``s3``: how to reach the bucket, keys included (the operator's reads); default: ``register_s3``,
        else the environment."""
        if isinstance(location, Loc):
            return location
        text = os.fspath(location)
        filesystem, path = _filesystem(text, s3)
        return cls(filesystem, path, "s3a://" if is_object_store(text) else "")

    # --------------------------------------------------------------- names
    @property
    def uri(self) -> str:
        """The location as Spark and the manifests spell it."""
        return f"{self.scheme}{self.path}"

    def __str__(self) -> str:
        return self.uri

    def __repr__(self) -> str:
        return f"Loc({self.uri!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Loc) and other.uri == self.uri

    def __hash__(self) -> int:
        return hash(self.uri)

    def __truediv__(self, rel: "str | PurePosixPath") -> "Loc":
        return Loc(self.fs, f"{self.path.rstrip('/')}/{str(rel).strip('/')}", self.scheme)

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    @property
    def parent(self) -> "Loc":
        return Loc(self.fs, str(PurePosixPath(self.path).parent), self.scheme)

    def with_name(self, name: str) -> "Loc":
        return self.parent / name

    def relative_to(self, other: "Loc") -> PurePosixPath:
        return PurePosixPath(self.path).relative_to(other.path)

    @property
    def is_object_store(self) -> bool:
        return bool(self.scheme)

    # --------------------------------------------------------------- reading
    def _type(self) -> pafs.FileType:
        return self.fs.get_file_info(self.path).type

    def exists(self) -> bool:
        return self._type() != pafs.FileType.NotFound

    def is_dir(self) -> bool:
        return self._type() == pafs.FileType.Directory

    def is_file(self) -> bool:
        return self._type() == pafs.FileType.File

    def size(self) -> int:
        return self.fs.get_file_info(self.path).size or 0

    def iterdir(self) -> list["Loc"]:
        """The entries directly inside; [] when the folder does not exist."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, allow_not_found=True))
        return [Loc(self.fs, i.path, self.scheme) for i in infos]

    def files(self) -> list[PurePosixPath]:
        """Every file below, relative, sorted; [] when the folder does not exist."""
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=True, allow_not_found=True))
        base = PurePosixPath(self.path)
        return sorted(PurePosixPath(i.path).relative_to(base) for i in infos if i.type == pafs.FileType.File)

    def read_bytes(self) -> bytes:
        try:
            with self.fs.open_input_stream(self.path) as f:
                return f.read()
        except OSError as exc:
            if not self.exists():
                raise FileNotFoundError(2, "No such file", self.uri) from exc
            raise

    def read_text(self) -> str:
        return self.read_bytes().decode("utf-8")

    # --------------------------------------------------------------- writing
    def mkdir(self) -> None:
        """Create the folder and its parents (nothing to do on an object store)."""
        if not self.is_object_store:
            self.fs.create_dir(self.path, recursive=True)

    def write_bytes(self, data: bytes) -> None:
        """Write the whole file so that readers see the old content or the new, never a part."""
        if self.is_object_store:
            with self.fs.open_output_stream(self.path) as f:   # one PUT: visible only when complete
                f.write(data)
            return
        self.parent.mkdir()
        tmp = self.with_name(f".{self.name}.{uuid.uuid4().hex[:8]}.tmp")
        with self.fs.open_output_stream(tmp.path) as f:
            f.write(data)
        self.fs.move(tmp.path, self.path)   # rename(2): atomic on a local file system

    def write_text(self, text: str) -> None:
        self.write_bytes(text.encode("utf-8"))

    def copy_to(self, dest: "Loc") -> None:
        """Copy this file to ``dest`` in the same store (a server-side copy on S3)."""
        if not dest.is_object_store:
            dest.parent.mkdir()
        self.fs.copy_file(self.path, dest.path)

    def move_to(self, dest: "Loc") -> None:
        """Rename (atomic on local files; on S3 a copy then a delete, so callers must not rely on it there)."""
        self.fs.move(self.path, dest.path)

    def unlink(self, missing_ok: bool = False) -> None:
        try:
            self.fs.delete_file(self.path)
        except (FileNotFoundError, OSError):
            if not missing_ok or self.exists():
                raise

    def rmtree(self) -> None:
        """Delete the folder and everything in it; nothing when it does not exist."""
        if self._type() == pafs.FileType.Directory:
            self.fs.delete_dir(self.path)

