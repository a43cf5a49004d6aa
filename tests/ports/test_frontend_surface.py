"""Every name of cudnn-frontend 1.32's graph-level surface exists here, as the surface table says.

The table is ``cudnn_graph._frontend_surface`` (the one list of names, keywords and statuses): a
"same" / "differs" name exists; a "not implemented" name is a stub that raises NotImplementedError
saying why; every keyword of every pygraph method is accepted, or refused with NotImplementedError,
as its row says; every unimplemented name is listed in docs/porting.md.
"""
from __future__ import annotations

import inspect

import pytest

import cudnn_graph as cudnn
from cudnn_graph import _frontend_surface as surface
from _helpers import REPO_ROOT

@pytest.mark.parametrize("name", sorted(surface.TOP_LEVEL))
def test_top_level_name_exists(name):
    status, why = surface.TOP_LEVEL[name]
    assert hasattr(cudnn, name), f"cudnn.{name} ({status}) is missing"
    if name in ("graph", "Graph", "graph_cache"):
        # cudnn.graph is the context manager, not this package's graph module (as in cudnn-frontend).
        assert not inspect.ismodule(getattr(cudnn, name)), f"cudnn.{name} is a module"
    assert status == surface.SAME or why, f"cudnn.{name}: a {status} row says why"


@pytest.mark.parametrize("name", sorted(n for n, (s, _) in surface.TOP_LEVEL.items() if s == surface.NOT_IMPLEMENTED))
def test_unimplemented_top_level_name_raises_saying_why(name):
    stub = getattr(cudnn, name)
    _, why = surface.TOP_LEVEL[name]
    with pytest.raises(NotImplementedError, match="not implemented"):
        stub()
    with pytest.raises(NotImplementedError) as info:
        stub.ANY_MEMBER           # an enum's member, a constant's use
    assert why in str(info.value)


@pytest.mark.parametrize("name", sorted(surface.PYGRAPH_METHODS))
def test_pygraph_method_exists(name):
    assert hasattr(cudnn.pygraph, name), f"pygraph.{name} is missing"


def _parameters(name):
    try:
        return inspect.signature(getattr(cudnn.pygraph, name)).parameters
    except (TypeError, ValueError):
        return None


@pytest.mark.parametrize("name", sorted(surface.PYGRAPH_METHODS))
def test_pygraph_keywords_are_accepted_or_listed(name):
    status, _ = surface.PYGRAPH_STATUS.get(name, (surface.SAME, ""))
    params = _parameters(name)
    if status == surface.NOT_IMPLEMENTED or params is None:
        return      # a stub takes anything and refuses it; a property has no keywords
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    missing = [k for k in surface.PYGRAPH_METHODS[name] if k not in params
               and (name, k) not in surface.KEYWORD_STATUS]
    assert not missing, f"pygraph.{name} lacks the keywords {missing} and the table does not say why"


@pytest.mark.parametrize("name", sorted(n for n, (s, _) in surface.PYGRAPH_STATUS.items() if s == surface.NOT_IMPLEMENTED))
def test_unimplemented_pygraph_method_raises_saying_why(name):
    g = cudnn.pygraph(device="cpu")
    _, why = surface.PYGRAPH_STATUS[name]
    with pytest.raises(NotImplementedError) as info:
        getattr(g, name)()
    assert why in str(info.value)


@pytest.mark.parametrize("keyword", ["sm_count", "sm_version", "cuda_graph_retention"])
def test_unimplemented_pygraph_constructor_keyword_raises_saying_why(keyword):
    _, why = surface.KEYWORD_STATUS[("pygraph", keyword)]
    with pytest.raises(NotImplementedError) as info:
        cudnn.pygraph(device="cpu", **{keyword: True})
    assert keyword in str(info.value) and why in str(info.value)


def test_unimplemented_op_keyword_is_declined_by_name():
    g = cudnn.pygraph(io_data_type=cudnn.data_type.FLOAT, device="cpu")
    x = g.tensor(name="x", dim=[2, 4], stride=[4, 1])
    with pytest.raises(NotImplementedError, match="group_offset"):
        g.reduction(x, mode=cudnn.reduction_mode.ADD, group_offset=x)
    assert g.nodes == () or len(g.nodes) == 0


def test_build_context_keyword_is_refused():
    g = cudnn.pygraph(device="cpu")
    with pytest.raises(NotImplementedError, match="ctx"):
        g.build(ctx=object())


def test_constructor_takes_the_frontends_positional_order():
    g = cudnn.pygraph("ported", cudnn.data_type.HALF, cudnn.data_type.FLOAT, cudnn.data_type.FLOAT, None,
                      device="cpu")
    assert g.context.name == "ported"
    assert g.context.io_data_type == cudnn.data_type.HALF


def test_every_unimplemented_name_is_listed_in_the_porting_guide():
    guide = (REPO_ROOT / "docs" / "porting.md").read_text()
    missing = [name for name in surface.not_implemented_names() if f"`{name}`" not in guide]
    assert not missing, f"docs/porting.md does not list {missing}"
