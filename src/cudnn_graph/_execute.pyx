"""``pygraph.execute``'s entry: the repeated call at C speed, everything else to the lifecycle.

The graph's lifecycle (``cudnn_graph.graph``) finds the selected plan's one-call executor at the
first execute and keeps it in the IR's ``_hot`` slot; a repeated call with no workspace and no
overrides goes from here straight into it (a Cython callable: no Python frame on the way). Any
other call, and the first one, is ``pygraph._execute``'s. This function is ``pygraph.execute``
itself (a method of the subclass, bound like any function), so the IR base class stays complete
without it.
"""
from cudnn_graph._ir cimport Graph


def execute(Graph self, variant_pack, workspace=None, handle=None, stream=None, *,
            override_uids=None, override_shapes=None, override_strides=None):
    """Run the selected plan on ``{Tensor | uid | name: buffer}``.

    Buffers may be any DLPack or CUDA-array-interface object, a Slot, or a bare int address
    (shaped by the tensor's declared geometry). Every buffer is checked before any launch.

    Example (a built graph ``g`` with tensors ``a``, ``b``, ``c`` and device buffers):
        >>> g.execute({a: a_buf, b: b_buf, c: c_buf}, stream=torch_stream)   # doctest: +SKIP
    """
    hot = self._hot
    if (hot is not None and hot is not False and workspace is None and override_uids is None
            and override_shapes is None and override_strides is None):
        hot(variant_pack, self.handle if handle is None else handle, stream)
        return
    self._execute(variant_pack, workspace, handle, stream, override_uids, override_shapes, override_strides)
