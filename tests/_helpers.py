"""Small helpers the CPU tests share (GPU-run helpers are in gpu_support.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

# The checkout's root (tests/ lies one level below it), for files the tests read: include/, bench/, engines/.
REPO_ROOT = Path(__file__).resolve().parents[1]


def c_compiler_or_skip(what: str) -> str:
    """The path of a C compiler (cc, gcc or clang), or a skip: there is none to build ``what``."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip(f"no C compiler to build {what}")
    return cc


def build_shared_library(source: str, folder, name: str, libs=()) -> Path:
    """Compile C ``source`` into ``folder/name`` (a shared library), or skip where no compiler is."""
    import subprocess
    cc = c_compiler_or_skip(name)
    folder = Path(folder)
    (folder / (name + ".c")).write_text(source)
    lib = folder / name
    subprocess.run([cc, "-shared", "-fPIC", "-O1", str(folder / (name + ".c")), "-o", str(lib), *libs], check=True)
    return lib


def host_address(a):
    """An explicit host Slot over a NumPy array's memory: a bare int is refused on a host graph, since the
    process would dereference memory it cannot prove is there."""
    from cudnn_graph import Slot
    return Slot.from_address(a.ctypes.data, a.shape, [s // a.itemsize for s in a.strides], dtype=a.dtype,
                             device="cpu")


def registered(engine):
    """A fixture body: ``engine`` in every plan list while the test runs (``yield from registered(e)``)."""
    from cudnn_graph.engines import manifest
    manifest.register_engine(engine)
    try:
        yield engine
    finally:
        manifest.unregister_engine(engine)


def package_is_built() -> bool:
    """Whether ``cudnn_graph`` imports with its compiled modules. Where it does not, a stub package over the
    checkout's cudnn_graph/ takes its place in ``sys.modules``, so that the pure-Python modules the CPU tests
    read directly (the reference engine's kernels) still resolve their ``cudnn_graph.*`` imports."""
    import sys
    import types
    try:
        import cudnn_graph
        return hasattr(cudnn_graph, "pygraph")
    except ImportError:
        stub = types.ModuleType("cudnn_graph")
        stub.__path__ = [str(REPO_ROOT / "cudnn_graph")]
        sys.modules["cudnn_graph"] = stub
        return False


def reference_linear_attention_kernels(module_name: str):
    """engines/reference/_kernels_linear_attention.py loaded from the checkout as ``module_name`` (its float64
    kernels, which the linear-attention tests check and check against), the package stubbed where it is not
    built (``package_is_built``)."""
    import importlib.util
    package_is_built()
    spec = importlib.util.spec_from_file_location(
        module_name, REPO_ROOT / "engines" / "reference" / "_kernels_linear_attention.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_by_path(package: str, folder: Path, *names: str) -> list:
    """Modules ``names`` of ``folder`` imported as submodules of a stand-in package ``package`` (engine modules
    that need none of cudnn_graph's compiled modules, loaded from the checkout)."""
    import importlib
    import sys
    import types
    if package not in sys.modules:
        stand_in = types.ModuleType(package)
        stand_in.__path__ = [str(folder)]
        sys.modules[package] = stand_in
    return [importlib.import_module(f"{package}.{name}") for name in names]
