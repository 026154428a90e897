"""``python -m flow_sdk.testing NAME [--config JSON] [PYTEST OPTIONS...]``: the contract suite
against the provider ``NAME``; exits with pytest's status."""

from __future__ import annotations

import sys

from flow_sdk.errors import install_hint


def main(argv: list[str]) -> int:
    try:
        import pytest
    except ImportError:
        print(install_hint("the contract suite", "pytest"), file=sys.stderr)
        return 2
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    name, rest = argv[0], argv[1:]
    options = ["--flow-provider", name]
    if rest[:1] == ["--config"]:
        if len(rest) < 2:
            print("--config needs a JSON object", file=sys.stderr)
            return 2
        options += ["--flow-provider-config", rest[1]]
        rest = rest[2:]
    return int(pytest.main(["-p", "flow_sdk.testing.plugin", "--pyargs",
                            "flow_sdk.testing.suite", *options, *rest]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
