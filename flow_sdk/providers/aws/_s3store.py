"""The object store on S3: payloads, task records, results and status under one key prefix.

Every request on the bucket passes ``ExpectedBucketOwner`` when the owner is known (always for
the default bucket ``flow-sdk-<account>-<region>``, whose owner is the caller's account): S3
refuses the request when another account owns a bucket of that name, so such a bucket never
receives a payload or serves a result. ``CreateBucket`` takes no owner (a bucket it creates is
the caller's own). On first use the client also brings the bucket's expiry rules for the
prefix up to date (``_lifecycle``).

``put_if_absent`` is a conditional write (``If-None-Match: *``), atomic on S3 since 2024: the
first writer of a key wins and every later one gets HTTP 412 PreconditionFailed. An
S3-compatible endpoint may implement the header as a check, then a write; the task's own
protocol (one outcome writer decides) does not rely on the store for that race.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.errors import ProviderError
from flow_sdk.providers.aws._clients import error_code, error_message, http_status
from flow_sdk.providers.aws._lifecycle import ensure_expiry
from flow_sdk.providers.base import ObjectStore, safe_part

_MISSING = ("NoSuchKey", "404", "NotFound")
_DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys
_NOT_OWNED = ("403", "AccessDenied", "Forbidden")


class S3ObjectStore(ObjectStore):
    """Keys live at ``s3://<bucket>/<prefix><key>``.

    ``client`` returns the S3 client; ``bucket`` resolves the bucket name and ``owner`` the
    account that must own it, or None when unchecked (both may need an STS call, so they are
    asked for lazily). With ``create_bucket`` the bucket is created on first use when missing,
    and its expiry rules set to ``expiry_days`` (the client side does this; nodes never do).
    """

    def __init__(self, client: Callable[[], Any], bucket: Callable[[], str], prefix: str,
                 region: str, *, create_bucket: bool,
                 owner: Callable[[], str | None] = lambda: None,
                 expiry_days: int | None = None) -> None:
        self._client = client
        self._bucket_name = bucket
        self._owner = owner
        self.prefix = prefix
        self.region = region
        self._create_bucket = create_bucket
        self._expiry_days = expiry_days
        self._ready = False
        self._lock = threading.Lock()

    # -- plumbing ---------------------------------------------------------------------------

    def _key(self, key: str) -> str:
        return self.prefix + safe_part(key, "object key")

    def _bucket(self) -> str:
        name = self._bucket_name()
        if self._create_bucket and not self._ready:
            with self._lock:
                if not self._ready:
                    self._ensure_bucket(name)
                    self._ready = True
        return name

    def _owned(self) -> dict[str, str]:
        """The ``ExpectedBucketOwner`` argument of every request (empty when unchecked)."""
        owner = self._owner()
        return {"ExpectedBucketOwner": owner} if owner is not None else {}

    def _args(self, **kwargs: Any) -> dict[str, Any]:
        """A request's arguments: the bucket (made ready on first use), its expected owner,
        and ``kwargs``."""
        return {"Bucket": self._bucket(), **self._owned(), **kwargs}

    def _ensure_bucket(self, name: str) -> None:
        s3 = self._client()
        owned = self._owned()
        try:
            s3.head_bucket(Bucket=name, **owned)
            exists = True
        except ClientError as exc:
            code = error_code(exc)
            if owned and code in _NOT_OWNED:
                raise self._not_owned(name, owned["ExpectedBucketOwner"], exc) from exc
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise self._error("check", name, exc) from exc
            exists = False
        if not exists:
            self._create(s3, name, owned)
        try:
            ensure_expiry(s3, name, owned, self.prefix, self._expiry_days)
        except ClientError as exc:
            raise ProviderError(
                f"could not set the expiry of task objects in bucket {name!r} to "
                f"{self._expiry_days} day(s): {error_code(exc)}: {error_message(exc)}; grant "
                "s3:GetLifecycleConfiguration and s3:PutLifecycleConfiguration on the bucket, "
                "or set provider_config object_expiry_days to null and remove old task objects "
                "with `flow gc --older-than`") from exc

    def _create(self, s3: Any, name: str, owned: dict[str, str]) -> None:
        kwargs: dict[str, Any] = {"Bucket": name}
        if self.region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": self.region}
        try:
            s3.create_bucket(**kwargs)
        except ClientError as exc:
            if owned and error_code(exc) == "BucketAlreadyExists":
                raise self._not_owned(name, owned["ExpectedBucketOwner"], exc) from exc
            if error_code(exc) != "BucketAlreadyOwnedByYou":
                raise self._error("create", name, exc) from exc
        s3.put_public_access_block(Bucket=name, PublicAccessBlockConfiguration={
            "BlockPublicAcls": True, "IgnorePublicAcls": True, "BlockPublicPolicy": True,
            "RestrictPublicBuckets": True}, **owned)

    def _not_owned(self, name: str, owner: str, exc: ClientError) -> ProviderError:
        return ProviderError(
            f"bucket {name!r} is not owned by account {owner} ({error_code(exc)}: "
            f"{error_message(exc)}): another account holds that name, or these credentials "
            "may not use it. flow never sends payloads to, or reads results from, a bucket "
            "another account owns; set provider_config bucket to a bucket of your own (and "
            "bucket_owner to its account)")

    def _error(self, verb: str, what: str, exc: ClientError) -> ProviderError:
        owner = self._owner()
        owned = (f", and that account {owner} owns it (every request expects that owner)"
                 if owner is not None else "")
        return ProviderError(f"S3 could not {verb} {what} in bucket {self._bucket_name()!r}: "
                             f"{error_code(exc)}: {error_message(exc)}; check that the bucket "
                             "exists in the provider's region and that your credentials (or the "
                             f"node's instance profile) may use it{owned}")

    # -- ObjectStore ------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> None:
        try:
            self._client().put_object(**self._args(Key=self._key(key), Body=data))
        except ClientError as exc:
            raise self._error("write", key, exc) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        for attempt in range(6):
            try:
                self._client().put_object(**self._args(Key=self._key(key), Body=data,
                                                       IfNoneMatch="*"))
                return True
            except ClientError as exc:
                code = error_code(exc)
                if code == "PreconditionFailed" or http_status(exc) == 412:
                    return False
                # 409: another conditional write to the key is in flight; it decides.
                if code != "ConditionalRequestConflict":
                    raise self._error("write", key, exc) from exc
                time.sleep(0.05 * (attempt + 1))
        raise ProviderError(f"S3 kept answering ConditionalRequestConflict for {key!r}: another "
                            "writer holds the key; retry the operation")

    def get(self, key: str) -> bytes | None:
        try:
            response = self._client().get_object(**self._args(Key=self._key(key)))
        except ClientError as exc:
            if error_code(exc) in _MISSING:
                return None
            raise self._error("read", key, exc) from exc
        body: bytes = response["Body"].read()
        return body

    def exists(self, key: str) -> bool:
        try:
            self._client().head_object(**self._args(Key=self._key(key)))
        except ClientError as exc:
            if error_code(exc) in _MISSING:
                return False
            raise self._error("check", key, exc) from exc
        return True

    def list(self, prefix: str) -> list[str]:
        full = self.prefix + prefix
        keys: list[str] = []
        try:
            pages = self._client().get_paginator("list_objects_v2").paginate(
                **self._args(Prefix=full))
            for page in pages:
                keys.extend(obj["Key"][len(self.prefix):] for obj in page.get("Contents", []))
        except ClientError as exc:
            raise self._error("list", f"{prefix!r}", exc) from exc
        return sorted(keys)

    def delete_prefix(self, prefix: str) -> int:
        keys = self.list(prefix)
        s3 = self._client()
        for start in range(0, len(keys), _DELETE_BATCH):
            batch = [{"Key": self.prefix + k} for k in keys[start:start + _DELETE_BATCH]]
            try:
                response = s3.delete_objects(**self._args(
                    Delete={"Objects": batch, "Quiet": True}))
            except ClientError as exc:
                raise self._error("delete", f"{prefix!r}", exc) from exc
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                raise ProviderError(f"S3 refused to delete {len(errors)} key(s) under {prefix!r}"
                                    f", e.g. {first.get('Key')}: {first.get('Code')} "
                                    f"{first.get('Message')}")
        return len(keys)
