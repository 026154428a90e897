"""AWS client helpers: error codes and the tolerated-error idiom."""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError

from flow_sdk.providers.aws._clients import error_code, tolerating


def client_error(code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": f"{code} happened"}}, "CreateThing")


def test_tolerating_swallows_only_the_named_codes() -> None:
    ran_after = []
    with tolerating("EntityAlreadyExists", "LimitExceeded"):
        raise client_error("LimitExceeded")
    ran_after.append(True)
    assert ran_after == [True]
    with pytest.raises(ClientError) as raised, tolerating("EntityAlreadyExists"):
        raise client_error("AccessDenied")
    assert error_code(raised.value) == "AccessDenied"


def test_tolerating_lets_other_exceptions_and_success_through() -> None:
    with tolerating("EntityAlreadyExists"):
        value = 1
    assert value == 1
    with pytest.raises(ValueError), tolerating("EntityAlreadyExists"):
        raise ValueError("not an AWS error")
