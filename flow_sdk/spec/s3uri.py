"""The one parser of ``s3://bucket/prefix`` URIs (stdlib only, low in the layers: the spec,
the data connector, S3 mounts and the aws provider's node policy all use it)."""

from __future__ import annotations

import re

BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")  # S3's bucket naming rules


class S3UriError(ValueError):
    """Not an ``s3://bucket/prefix`` URI."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b/")``: the bucket and the key or prefix as
    written (leading slashes dropped). Raises S3UriError when ``uri`` is not an S3 URI."""
    if not isinstance(uri, str) or not uri.startswith("s3://"):
        raise S3UriError(f"not an S3 URI: {uri!r}; expected s3://bucket/prefix")
    bucket, _, key = uri[len("s3://"):].partition("/")
    if not bucket:
        raise S3UriError(f"S3 URI {uri!r} names no bucket; expected s3://bucket/prefix")
    return bucket, key.lstrip("/")


def folder_prefix(key: str) -> str:
    """A prefix read as a folder: ``a/b`` -> ``a/b/``; the whole bucket is ``""``."""
    key = key.strip("/")
    return f"{key}/" if key else ""
