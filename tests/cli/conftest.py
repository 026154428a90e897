"""The aws tests' fixtures for the command-line tests that launch on moto: a moto server with
what moto lacks filled in, a fresh world per test (``aws``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_AWS_TESTS = Path(__file__).parents[1] / "providers" / "aws"
sys.path.insert(0, str(_AWS_TESTS))  # aws_moto_world, which the aws fixtures import
_spec = importlib.util.spec_from_file_location("aws_fixtures", _AWS_TESTS / "conftest.py")
assert _spec is not None and _spec.loader is not None
aws_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(aws_fixtures)

moto_url = aws_fixtures.moto_url
_moto_gaps = aws_fixtures._moto_gaps
aws = aws_fixtures.aws
