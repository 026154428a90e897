"""tests/gpu run where CUDA is present; elsewhere every test here is skipped, with the reason."""

from __future__ import annotations

import pytest
import torch

NO_CUDA = "needs a CUDA device: torch.cuda.is_available() is False on this machine"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda = torch.cuda.is_available()
    for item in items:
        if item.path.parent.name == "gpu" and item.path.parent.parent.name == "tests":
            item.add_marker(pytest.mark.gpu)
            if not cuda:
                item.add_marker(pytest.mark.skip(reason=NO_CUDA))
