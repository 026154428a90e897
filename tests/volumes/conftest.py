"""Fixtures of the volume tests, shared by the directory (defined in volumes_helpers; test
modules import plain helpers from there, never from ``conftest``)."""

from volumes_helpers import (  # noqa: F401 - registered as this directory's fixtures
    _no_network,
    literal_paths,
    moto_s3_url,
    s3_data,
    s3_env,
    s3_many_keys,
)
