"""What the simulated account's moto server lacks and flow calls: EC2 placement groups
(``CreatePlacementGroup``, ``DescribePlacementGroups``, ``DeletePlacementGroup``), kept in
this server process's memory, per account and region, and the instance profile of every
instance of a launch (moto associates it with the first one only; each simulated instance's
metadata service hands out its role's credentials), and ``NoSuchEntity`` for removing a
role an instance profile no longer holds (two teardowns at once: moto answers 500); and, for
speed, its list of services made once. Installed once by ``install()`` in the server process
(``_serve``), never in a caller's; the tests' in-process moto takes ``ACTIONS``,
``profile_for_every_instance`` and ``list_services_once``."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable
from typing import Any

# Placement groups by (account, region), then by name.
PLACEMENT_GROUPS: dict[tuple[str, str], dict[str, dict[str, Any]]] = defaultdict(dict)


def _error(code: str, message: str) -> Exception:
    from moto.ec2.exceptions import EC2ClientError

    return EC2ClientError(code, message)


def _create(self: Any) -> Any:
    from moto.core.responses import ActionResult

    name = self._get_param("GroupName")
    groups = PLACEMENT_GROUPS[(self.current_account, self.region)]
    if name in groups:
        raise _error("InvalidPlacementGroup.Duplicate",
                     f"The placement group '{name}' already exists.")
    tags = self._parse_tag_specification().get("placement-group", {})
    group = {"GroupName": name, "State": "available", "Strategy": self._get_param("Strategy"),
             "GroupId": f"pg-{len(groups) + 1:017x}",
             "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
    groups[name] = group
    return ActionResult({"PlacementGroup": group})


def _matches(group: dict[str, Any], name: str, values: list[str]) -> bool:
    tags = group["Tags"]
    if name.startswith("tag:"):
        return any(t["Key"] == name[4:] and t["Value"] in values for t in tags)
    if name == "tag-key":
        return any(t["Key"] in values for t in tags)
    if name == "group-name":
        return group["GroupName"] in values
    raise _error("InvalidParameterValue", f"the simulated cloud cannot filter placement "
                 f"groups by {name!r}; filters: tag:KEY, tag-key, group-name")


def _describe(self: Any) -> Any:
    from moto.core.responses import ActionResult

    groups = list(PLACEMENT_GROUPS[(self.current_account, self.region)].values())
    for name, values in self._filters_from_querystring().items():
        groups = [g for g in groups if _matches(g, name, list(values))]
    names = self._get_param("GroupNames", [])
    if names:
        groups = [g for g in groups if g["GroupName"] in names]
    return ActionResult({"PlacementGroups": groups})


def _delete(self: Any) -> Any:
    from moto.core.responses import ActionResult

    name = self._get_param("GroupName")
    groups = PLACEMENT_GROUPS[(self.current_account, self.region)]
    if name not in groups:
        raise _error("InvalidPlacementGroup.Unknown",
                     f"The Placement Group '{name}' is unknown.")
    del groups[name]
    return ActionResult({})


def profile_for_every_instance(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """moto's RunInstances responder, associating the instance profile with every instance
    it starts, as EC2 does."""

    def run_instances(self: Any) -> Any:
        result = original(self)
        name = self._get_param("IamInstanceProfile.Name")
        arn = self._get_param("IamInstanceProfile.Arn")
        if name or arn:
            for instance in result.result.instances[1:]:
                self.ec2_backend.associate_iam_instance_profile(
                    instance_id=instance.id, iam_instance_profile_name=name,
                    iam_instance_profile_arn=arn)
        return result

    return run_instances


# moto's EC2 responder methods, by name, that serve the placement-group actions.
ACTIONS: dict[str, Callable[[Any], Any]] = {"create_placement_group": _create,
                                            "describe_placement_groups": _describe,
                                            "delete_placement_group": _delete}


def role_already_removed(original: Callable[[Any, str, str], None]
                         ) -> Callable[[Any, str, str], None]:
    """moto's ``remove_role_from_instance_profile``, answering as IAM does (``NoSuchEntity``)
    when the profile no longer holds the role, instead of a ``ValueError`` (a 500)."""
    def remove_role_from_instance_profile(self: Any, profile_name: str, role_name: str
                                          ) -> None:
        from moto.iam.exceptions import NotFoundException

        profile = self.get_instance_profile(profile_name)
        if self.get_role(role_name) not in profile.roles:
            raise NotFoundException(f"Role {role_name} is not in instance profile "
                                    f"{profile_name}")
        original(self, profile_name, role_name)

    return remove_role_from_instance_profile


def list_services_once() -> None:
    """moto's server lists the folders of its package at every request, to tell whether the
    host name names a service: a tenth of a busy server's CPU. They do not change while it
    runs: list them once (this process only; the tests' in-process servers take it too)."""
    from moto import backends

    original = backends.list_of_moto_modules
    if hasattr(original, "cache_info"):  # already listed once in this process
        return
    backends.list_of_moto_modules = functools.cache(  # type: ignore[assignment]
        lambda: tuple(original()))


def install() -> None:
    """Give moto's EC2 responder the placement-group actions, and an instance profile on
    every instance of a launch; answer a role removed twice as IAM does; list moto's services
    once (this process only)."""
    from moto.ec2.responses import EC2Response
    from moto.iam.models import IAMBackend

    list_services_once()

    remove = role_already_removed(IAMBackend.remove_role_from_instance_profile)
    IAMBackend.remove_role_from_instance_profile = remove  # type: ignore[method-assign]

    for name, fn in ACTIONS.items():
        setattr(EC2Response, name, fn)
    EC2Response.run_instances = profile_for_every_instance(  # type: ignore[method-assign]
        EC2Response.run_instances)
