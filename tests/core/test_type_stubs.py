"""The .pyi stubs of the compiled modules match the modules: every public name of a compiled class or
module is in its stub, every name a stub declares exists, and functions and methods take the same
parameters (so the stubs cannot rot as the Cython code changes). The stubs and py.typed are installed."""
from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

from _helpers import REPO_ROOT

STUBBED = ("_slot", "_variant_pack", "_ir", "_stream", "_cudnn_handle")
# Dunders a stub declares because they are part of a class's API (the rest are Python's own).
API_DUNDERS = {"__len__", "__getitem__", "__int__", "__index__", "__dlpack__", "__dlpack_device__",
               "__dlpack_c_exchange_api__"}


def _stub(name: str) -> ast.Module:
    return ast.parse((REPO_ROOT / "src" / "cudnn_graph" / f"{name}.pyi").read_text())


def _declared(body) -> dict[str, ast.AST]:
    """name -> declaring node, for the defs, classes and annotated attributes of a stub body."""
    names = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.setdefault(node.name, node)   # a property's setter repeats its name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
    return names


def _is_api(name: str) -> bool:
    return not name.startswith("_") or name in API_DUNDERS


def _stub_parameters(node: ast.FunctionDef, *, method: bool) -> list[tuple[str, str, bool]]:
    """(name, kind, has default) per parameter, as inspect names kinds; ``self`` left out of methods."""
    a = node.args
    positional = a.posonlyargs + a.args
    defaults = [False] * (len(positional) - len(a.defaults)) + [True] * len(a.defaults)
    params = [(p.arg, "POSITIONAL_OR_KEYWORD", d) for p, d in zip(positional, defaults)]
    if method and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list):
        params = params[1:]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", False))
    params += [(p.arg, "KEYWORD_ONLY", d is not None) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", False))
    return params


def _real_parameters(obj) -> list[tuple[str, str, bool]] | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None          # a slot wrapper (__len__, ...): nothing to compare
    return [(p.name, p.kind.name, p.default is not inspect.Parameter.empty)
            for p in sig.parameters.values() if p.name != "self"]


def _init_parameters(cls) -> list[tuple[str, bool]] | None:
    """(name, has default) per parameter of a compiled class's __init__, from the signature Cython embeds
    as the first line of the class docstring (inspect cannot see it). Kinds are not compared: Cython
    3's embedded __init__ signature places the bare ``*`` one parameter late."""
    first = (cls.__doc__ or "").splitlines()[0] if cls.__doc__ else ""
    if not first.startswith(cls.__name__ + "("):
        return None
    args = ast.parse(f"def f{first[len(cls.__name__):]}: pass").body[0].args
    positional = args.posonlyargs + args.args
    return ([(p.arg, i >= len(positional) - len(args.defaults)) for i, p in enumerate(positional)]
            + [(p.arg, d is not None) for p, d in zip(args.kwonlyargs, args.kw_defaults)])


def _compiled_classes_and_functions(module):
    """The module's own public classes and functions, and its public constants (str, int, ...)."""
    return {n: o for n, o in vars(module).items()
            if not n.startswith("_") and (getattr(o, "__module__", None) == module.__name__
                                          and (isinstance(o, type) or callable(o))
                                          or isinstance(o, (str, int, float, tuple, frozenset)))}


@pytest.mark.parametrize("name", STUBBED)
def test_stub_declares_every_public_class_and_function_of_the_module(name):
    module = importlib.import_module(f"cudnn_graph.{name}")
    declared = _declared(_stub(name).body)
    missing = sorted(set(_compiled_classes_and_functions(module)) - set(declared))
    assert not missing, f"cudnn_graph/{name}.pyi lacks {missing}"
    unknown = sorted(n for n in declared if not hasattr(module, n))
    assert not unknown, f"cudnn_graph/{name}.pyi declares {unknown}, which cudnn_graph.{name} does not have"


@pytest.mark.parametrize("name", STUBBED)
def test_stub_classes_list_exactly_the_public_members_of_the_compiled_classes(name):
    module = importlib.import_module(f"cudnn_graph.{name}")
    for cls_node in (n for n in _stub(name).body if isinstance(n, ast.ClassDef)):
        cls = getattr(module, cls_node.name)
        declared = {n for n in _declared(cls_node.body) if n != "__init__"}
        real = {n for n in vars(cls) if _is_api(n)}
        assert real - declared == set(), f"{name}.pyi: {cls_node.name} lacks {sorted(real - declared)}"
        assert declared - real == set(), f"{name}.pyi: {cls_node.name} has no {sorted(declared - real)}"


@pytest.mark.parametrize("name", STUBBED)
def test_stub_signatures_take_the_parameters_of_the_compiled_functions(name):
    module = importlib.import_module(f"cudnn_graph.{name}")
    checked = 0
    for node in _stub(name).body:
        if isinstance(node, ast.FunctionDef):
            pairs = [(node, getattr(module, node.name), False)]
        elif isinstance(node, ast.ClassDef):
            cls = getattr(module, node.name)
            pairs = [(m, vars(cls).get(m.name, getattr(cls, m.name)), True) for m in node.body
                     if isinstance(m, ast.FunctionDef) and not any(
                         isinstance(d, (ast.Name, ast.Attribute)) and ast.unparse(d).startswith(("property", m.name))
                         for d in m.decorator_list)]
        else:
            continue
        for fn, real, method in pairs:
            if fn.name == "__init__":
                expected_init = _init_parameters(cls)
                assert expected_init is not None, f"{name}.pyi: {node.name}.__init__ has no embedded signature"
                assert [(n, d) for n, _, d in _stub_parameters(fn, method=True)] == expected_init, \
                    f"{name}.pyi: {node.name}.__init__"
                checked += 1
                continue
            if fn.name.startswith("__"):
                continue     # a C slot (__len__, __getitem__, ...): Python fixes its parameters
            real = real.__func__ if isinstance(real, staticmethod) else real
            expected = _real_parameters(real)
            if expected is None:
                continue
            assert _stub_parameters(fn, method=method) == expected, f"{name}.pyi: {fn.name}"
            checked += 1
    assert checked > 0


def test_stubs_and_py_typed_are_installed_beside_the_compiled_modules():
    import cudnn_graph._slot
    installed = Path(cudnn_graph._slot.__file__).parent
    if installed != Path(cudnn_graph.__file__).parent:
        pytest.skip("an editable install serves the compiled modules from its build folder")
    assert (installed / "py.typed").is_file()
    for name in STUBBED:
        stub = installed / f"{name}.pyi"
        assert stub.is_file(), f"{stub} is not installed (meson.build's install_sources of the stubs)"
        assert stub.read_text() == (REPO_ROOT / "src" / "cudnn_graph" / f"{name}.pyi").read_text()


def test_every_cython_name_the_package_exports_has_a_stub():
    import cudnn_graph
    for export in cudnn_graph.__all__:
        obj = getattr(cudnn_graph, export)
        module = getattr(obj, "__module__", None)
        if not (isinstance(module, str) and module.startswith("cudnn_graph.")):
            continue
        if not getattr(importlib.import_module(module), "__file__", "").endswith((".so", ".pyd")):
            continue            # a pure-Python module: its own annotations serve
        short = module.split(".", 1)[1]
        assert short in STUBBED, f"cudnn_graph.{export} comes from {module}, which has no .pyi"
        assert obj.__name__ in _declared(_stub(short).body), f"{short}.pyi lacks {obj.__name__}"
