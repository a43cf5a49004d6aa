"""What the CPU tests of the JAX adapter share: skipped where jax is not installed, jax imported when the first
test runs rather than at collection (a process that imported jax must not fork, and other tests' multiprocessing
would warn of deadlocks), and every test run with JAX's CPU device as its default."""
from __future__ import annotations

import contextlib
import importlib
import importlib.util

import pytest

NEEDS_JAX = pytest.mark.skipif(importlib.util.find_spec("jax") is None, reason="jax is not installed")


@contextlib.contextmanager
def jax_on_cpu(module_globals: dict):
    """Bind ``jax``, ``jnp`` and ``cgjax`` (cudnn_graph.jax) in a test module's globals, imported at the first
    call, and run the body with the CPU device as JAX's default (an autouse fixture's body)."""
    if module_globals.get("jax") is None:
        module_globals["jax"] = importlib.import_module("jax")
        module_globals["jnp"] = importlib.import_module("jax.numpy")
        module_globals["cgjax"] = importlib.import_module("cudnn_graph.jax")
    jax = module_globals["jax"]
    with jax.default_device(jax.devices("cpu")[0]):
        yield
