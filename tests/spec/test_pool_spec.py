"""The pool options of a task: a pool name, an idle time in the units users write, spares;
and what makes no sense without a pool is refused naming the field and the fix."""

from __future__ import annotations

import pytest

from flow_sdk.errors import ValidationError
from flow_sdk.spec import build_task_spec


@pytest.mark.parametrize(("given", "seconds"), [("20m", 1200.0), ("2h", 7200.0),
                                                ("90s", 90.0), ("1.5h", 5400.0), (45, 45.0)])
def test_idle_stop_reads_the_units_users_write(given: object, seconds: float) -> None:
    assert build_task_spec(app="a", name="t", pool="dev", idle_stop=given).idle_stop == seconds


@pytest.mark.parametrize(("options", "field", "says"), [
    ({"idle_stop": "20m"}, "idle_stop", "add pool='NAME'"),
    ({"spares": 1}, "spares", "add pool='NAME'"),
    ({"pool": "Dev_1"}, "pool", "lowercase letters"),
    ({"pool": "dev", "idle_stop": "soon"}, "idle_stop", "such as '20m'"),
    ({"pool": "dev", "idle_stop": "0s"}, "idle_stop", "more than 0"),
    ({"pool": "dev", "num_instances": 2, "min_instances": 1}, "min_instances", "up already"),
])
def test_pool_options_that_make_no_sense_name_the_field(options: dict[str, object], field: str,
                                                        says: str) -> None:
    with pytest.raises(ValidationError) as info:
        build_task_spec(app="a", name="t", **options)
    assert info.value.fields == [field]
    assert says in str(info.value)
