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


@pytest.fixture
def prefer_cudnn():
    """Rank the cuDNN backend's plans first, for tests that pin cuDNN's own behaviour (plan names, handles,
    graph replay): the CuTe GEMM engine, where installed, claims the same matmul graphs and would win."""
    from cudnn_graph.router import PreferFamily, set_default_router
    previous = set_default_router(PreferFamily("cudnn"))
    yield
    set_default_router(previous)


# Compiled DSL kernels go to a cache folder of this test session, not the user's: a test that wants a
# warm or a cold cache says so, and no run leaves entries behind.
if "CUDNN_GRAPH_KERNEL_CACHE_DIR" not in os.environ:
    import atexit as _atexit
    import shutil as _shutil
    import tempfile as _tempfile
    os.environ["CUDNN_GRAPH_KERNEL_CACHE_DIR"] = _tempfile.mkdtemp(prefix="cudnn_graph_test_kernels_")
    _atexit.register(_shutil.rmtree, os.environ["CUDNN_GRAPH_KERNEL_CACHE_DIR"], True)
