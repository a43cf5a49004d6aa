import os

import pytest


def _gpu_visible() -> bool:
    try:
        from cudnn_graph import _driver
        return _driver.device_count() > 0
    except Exception:
        return False


GPU = _gpu_visible()


def pytest_collection_modifyitems(config, items):
    if GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA GPU visible")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
