"""Task objects expire: an S3 lifecycle rule per flow prefix on the store's bucket.

One rule per prefix: objects under ``<prefix>tasks/`` (task records, results, errors,
outcomes, membership, node records) expire N days after they were written. Content-addressed
objects shared between tasks are not expired by the bucket: a payload (``payloads/``) or an
SDK wheel (``code/``) that a later task reuses is not written again by it, so an age-based rule
could delete it under that task. ``flow gc --older-than`` removes the payloads that only
removed tasks named.

Rules of other prefixes and the user's own rules in the bucket are kept: the lifecycle
configuration is read, the flow rule of this prefix replaced, and written back only when it
differs. ``object_expiry_days=None`` removes this prefix's rule.
"""

from __future__ import annotations

import hashlib
from typing import Any

from botocore.exceptions import ClientError

from flow_sdk.providers.aws._clients import error_code

RULE_ID_PREFIX = "flow-sdk-expire-"
EXPIRING_FOLDERS = ("tasks/",)
_NO_RULES = ("NoSuchLifecycleConfiguration",)


def rule_ids(prefix: str) -> dict[str, str]:
    """The lifecycle rule id of each expiring folder of ``prefix`` (ids name the prefix by
    digest: two flow prefixes in one bucket each keep their own rules)."""
    base = RULE_ID_PREFIX + hashlib.sha256(prefix.encode()).hexdigest()[:12]
    return {folder: f"{base}-{folder.rstrip('/')}" for folder in EXPIRING_FOLDERS}


def expiry_rules(prefix: str, days: int | None) -> list[dict[str, Any]]:
    """The lifecycle rules that expire this prefix's task objects after ``days`` (none for
    None)."""
    if days is None:
        return []
    return [{"ID": rule_id, "Filter": {"Prefix": prefix + folder}, "Status": "Enabled",
             "Expiration": {"Days": days}} for folder, rule_id in rule_ids(prefix).items()]


def _same(have: dict[str, Any], want: dict[str, Any]) -> bool:
    return (have.get("Status") == want["Status"]
            and (have.get("Filter") or {}).get("Prefix") == want["Filter"]["Prefix"]
            and (have.get("Expiration") or {}).get("Days") == want["Expiration"]["Days"])


def ensure_expiry(s3: Any, bucket: str, owner: dict[str, str], prefix: str,
                  days: int | None) -> bool:
    """Bring the bucket's flow rules for ``prefix`` to ``days``; ``owner`` holds the
    ``ExpectedBucketOwner`` argument (or nothing). Returns whether it wrote the configuration.
    Raises ``ClientError`` as S3 answers it."""
    try:
        current = s3.get_bucket_lifecycle_configuration(Bucket=bucket, **owner)["Rules"]
    except ClientError as exc:
        if error_code(exc) not in _NO_RULES:
            raise
        current = []
    ours = set(rule_ids(prefix).values())
    wanted = expiry_rules(prefix, days)
    have = {r.get("ID"): r for r in current if r.get("ID") in ours}
    if len(have) == len(wanted) and all(
            r["ID"] in have and _same(have[r["ID"]], r) for r in wanted):
        return False
    rules = [r for r in current if r.get("ID") not in ours] + wanted
    if rules:
        s3.put_bucket_lifecycle_configuration(Bucket=bucket, LifecycleConfiguration={
            "Rules": rules}, **owner)
    else:
        s3.delete_bucket_lifecycle(Bucket=bucket, **owner)
    return True
