"""Variant-pack keys are checked to belong to the graph being executed (issue 20, item 1).

A key is a Tensor, a uid or a tensor name. A Tensor of another graph is refused (``ForeignTensorError``)
rather than matched by its uid, a virtual tensor is named as such (``VirtualTensorError``), and a tensor
given twice is a ``DuplicateTensorError`` naming it and both keys. Each is a ``CudnnGraphError`` (and a
``ValueError``, as before).
"""
from __future__ import annotations

import numpy as np
import pytest

import cudnn_graph as cudnn
from cudnn_graph import (CudnnGraphError, DuplicateTensorError, ForeignTensorError, PackLayout, TensorSpec,
                         UnknownTensorError, VirtualTensorError)

FLOAT = cudnn.data_type.FLOAT


def _sub_graph(first: str, second: str, name: str = ""):
    """o = p - q on the host; ``first`` / ``second`` say which of p, q is declared (given a uid) first."""
    g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu", name=name)
    made = {n: g.tensor(name=n, dim=[4], stride=[1]) for n in (first, second)}
    p, q = made["p"], made["q"]
    o = g.sub(p, q).set_output(True).set_name("o")
    g.build([cudnn.heur_mode.A])
    return g, p, q, o


def test_a_foreign_tensor_is_refused_not_matched_by_uid():
    # The issue's example: g2's uids are swapped, so matching by uid would compute Q - P.
    g1, p, q, o = _sub_graph("p", "q", name="g1")
    g2, p2, q2, _ = _sub_graph("q", "p", name="g2")
    assert (p2.uid, q2.uid) == (q.uid, p.uid)
    P, Q, O = np.full(4, 10, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32)
    with pytest.raises(ForeignTensorError) as info:
        g1.execute({p2: P, q2: Q, o: O})
    err = info.value
    assert isinstance(err, UnknownTensorError) and isinstance(err, CudnnGraphError)
    assert err.tensor_name in ("p", "q") and "graph 'g2'" in str(err) and "graph 'g1'" in str(err)
    assert f"tensor '{err.tensor_name}' (uid {err.uid})" in str(err)
    assert not O.any()                                     # nothing was written
    g1.execute({p: P, q: Q, o: O})                         # the graph stays usable
    np.testing.assert_array_equal(O, P - Q)


def test_foreign_tensor_on_the_repeated_fast_path_and_through_uid_and_name_keys():
    g1, p, q, o = _sub_graph("p", "q")
    g2, p2, q2, _ = _sub_graph("q", "p")
    P, Q, O = np.full(4, 10, np.float32), np.ones(4, np.float32), np.zeros(4, np.float32)
    for _ in range(3):                                     # the first call, then the hot one
        g1.execute({p: P, q: Q, o: O})
        with pytest.raises(ForeignTensorError, match="an unnamed graph"):
            g1.execute({p: P, q2: Q, o: O})
    # uids and names are this graph's own namespace: they stay accepted.
    g1.execute({p.uid: P, "q": Q, o: O})
    np.testing.assert_array_equal(O, P - Q)


def test_a_layout_without_a_graph_takes_tensors_by_uid():
    g, p, q, o = _sub_graph("p", "q")
    layout = PackLayout([TensorSpec(p.uid, (4,), "float32", device="cpu", name="p")])
    assert layout.graph is None
    assert layout.pack({p: np.zeros(4, np.float32)}).uids == (p.uid,)


def _virtual_chain():
    g = cudnn.pygraph(io_data_type=FLOAT, compute_data_type=FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[4], stride=[1])
    h = g.relu(x).set_name("hidden")
    y = g.neg(h).set_output(True).set_name("y")
    g.build([cudnn.heur_mode.A])
    return g, x, h, y


@pytest.mark.parametrize("how", ["tensor", "uid", "name"])
def test_a_virtual_tensor_in_the_pack_is_named_as_virtual(how):
    g, x, h, y = _virtual_chain()
    a = np.ones(4, np.float32)
    key = {"tensor": h, "uid": h.uid, "name": "hidden"}[how]
    with pytest.raises(VirtualTensorError) as info:
        g.execute({x: a, key: a.copy(), y: np.zeros(4, np.float32)})
    assert isinstance(info.value, UnknownTensorError)
    assert info.value.tensor_name == "hidden" and info.value.uid == h.uid
    assert str(info.value).startswith(f"tensor 'hidden' (uid {h.uid}) is virtual (an intermediate")


def test_an_unknown_uid_and_name_stay_unknown_tensor_errors():
    g, x, h, y = _virtual_chain()
    a = np.ones(4, np.float32)
    with pytest.raises(UnknownTensorError, match="uid 12345 is not a tensor of this graph") as info:
        g.execute({x: a, y: a.copy(), 12345: a})
    assert info.type is UnknownTensorError
    with pytest.raises(UnknownTensorError, match="no tensor named 'nope'") as info:
        g.execute({x: a, y: a.copy(), "nope": a})
    assert info.type is UnknownTensorError


@pytest.mark.parametrize("second", ["uid", "name"])
def test_a_tensor_given_twice_is_a_duplicate_tensor_error_naming_it(second):
    g, x, h, y = _virtual_chain()
    a = np.ones(4, np.float32)
    pack = {x: a, y: np.zeros(4, np.float32)}
    pack[x.uid if second == "uid" else "x"] = a.copy()
    with pytest.raises(DuplicateTensorError) as info:
        g.execute(pack)
    err = info.value
    assert isinstance(err, ValueError) and isinstance(err, CudnnGraphError)
    assert (err.tensor_name, err.uid) == ("x", x.uid)
    other = f"uid {x.uid}" if second == "uid" else "name 'x'"
    assert str(err) == f"tensor 'x' (uid {x.uid}) is given twice in the variant pack (as Tensor 'x' and {other})"
