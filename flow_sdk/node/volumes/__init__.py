"""The node half of volumes and S3 mounts: what a node's agent does with a task's volumes and
mounts before its workers start (``prepare``) and the S3 mount caches (``s3mount``). The rest
is ``flow_sdk.volumes``: named volumes and their handles, which the caller uses, and what user
code calls wherever it runs (``current.path``'s mount table, the checkpoint helpers)."""
