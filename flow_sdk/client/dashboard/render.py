"""The dashboard's markup: Jinja2 templates (``templates/``) rendered with autoescape on for
every template, so each value a page, a stream or the timeline shows is escaped where the
template writes it. ``render`` is the one maker of markup: what it returns (``Markup``) goes
into another template as it is; any plain string is escaped there."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from markupsafe import Markup

from flow_sdk.wire.tracebacks import stack_text

TEMPLATES = Path(__file__).resolve().parent / "templates"


def seconds(value: float | None) -> str:
    """``75`` -> ``1m 15s``; ``None`` -> ``-``."""
    if value is None:
        return "-"
    value = int(value)
    if value >= 3600:
        return f"{value // 3600}h {value % 3600 // 60}m"
    if value >= 60:
        return f"{value // 60}m {value % 60}s"
    return f"{value}s"


def usd(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"${value:,.{digits}f}"


def when(epoch: float | None) -> str:
    return "-" if epoch is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


_ENV = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True,
                   undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_ENV.filters.update(seconds=seconds, usd=usd, when=when, stack=stack_text)


def render(template: str, **values: Any) -> Markup:
    """``template`` (a name in ``templates/``) rendered with ``values``, every one escaped
    unless it is itself ``Markup`` that ``render`` made."""
    return Markup(_ENV.get_template(template).render(**values))
