"""``import cudnn_graph`` never imports jax (cudnn_graph.jax is the one module that does, imported by the user),
and the handler module's registration checks need no jax either."""
from __future__ import annotations

import subprocess
import sys


def test_import_cudnn_graph_imports_no_jax():
    code = ("import sys, cudnn_graph, cudnn_graph._xla_ffi\n"
            "assert 'jax' not in sys.modules, sorted(m for m in sys.modules if m.startswith('jax'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr


def test_the_handler_capsule_needs_no_jax():
    from cudnn_graph import _xla_ffi
    assert type(_xla_ffi.handler_capsule()).__name__ == "PyCapsule"
    assert type(_xla_ffi.handler_capsule(True)).__name__ == "PyCapsule"
    assert _xla_ffi.header_api_version() == (0, 3)


def test_another_major_ffi_version_is_refused_at_registration():
    import pytest
    from cudnn_graph import _xla_ffi
    from cudnn_graph.errors import FfiRegistrationError
    before = _xla_ffi.reported_api_version()
    with pytest.raises(FfiRegistrationError, match="major version 0"):
        _xla_ffi.set_reported_api_version(1, 0)
    assert _xla_ffi.reported_api_version() == before


def test_a_graph_without_a_built_plan_is_refused():
    import pytest
    import cudnn_graph as cudnn
    from cudnn_graph import _xla_ffi
    from cudnn_graph.errors import FfiRegistrationError
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[2, 3], stride=[3, 1])
    y = g.relu(a).set_output(True)
    with pytest.raises(FfiRegistrationError, match="no built plan"):
        _xla_ffi.register_graph(g, [a], [y])


def test_a_virtual_operand_is_refused_naming_it():
    import pytest
    import cudnn_graph as cudnn
    from cudnn_graph import _xla_ffi
    from cudnn_graph.errors import FfiRegistrationError
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, compute_data_type=cudnn.data_type.FLOAT, device="cpu")
    a = g.tensor(name="a", dim=[2, 3], stride=[3, 1])
    mid = g.relu(a).set_name("mid")
    y = g.relu(mid).set_output(True)
    g.build([cudnn.heur_mode.A])
    with pytest.raises(FfiRegistrationError, match=r"output 0 \(tensor 'mid'\) is virtual"):
        _xla_ffi.register_graph(g, [a], [mid, y])
