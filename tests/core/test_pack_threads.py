"""Thread safety of packing: 16 threads share ONE PackLayout and never see each other's pointers.

Each thread packs 10k different buffers (NumPy slices through ``__dlpack__``, raw int addresses (device tensors: a host one refuses a bare int), and
alternately exchange-API producers and Slots) and checks that every pack's data pointers, both the
Python view and the C pointer array, are exactly its own buffers.
"""
from __future__ import annotations

import ctypes
import sys
import threading

import numpy as np

from cudnn_graph import PackLayout, Slot, TensorSpec, VariantPack
from cudnn_graph._testing import exchange_producer as ep

N_THREADS = 16
N_PACKS = 10_000


def _ptr(a):
    return a.__array_interface__["data"][0]


def test_sixteen_threads_share_one_layout_without_mixing_pointers():
    layout = PackLayout([
        TensorSpec(1, (4,), "float32", device="cpu", name="x"),
        TensorSpec(2, (4,), "float32", device="cuda", name="addr"),
        TensorSpec(3, (2, 2), "float32", device="cpu", name="y", is_output=True),
    ])
    barrier = threading.Barrier(N_THREADS)
    mismatches = [None] * N_THREADS
    checked = [0] * N_THREADS
    failures = []

    def worker(t):
        try:
            xs = np.zeros(4 * N_PACKS, np.float32)          # every buffer of every thread is distinct
            raw = np.zeros(4 * N_PACKS, np.float32)
            ys = np.zeros(4 * N_PACKS, np.float32)
            raw_ptr, y_ptr = _ptr(raw), _ptr(ys)
            bad = 0
            barrier.wait()
            for i in range(N_PACKS):
                x = xs[4 * i:4 * i + 4]
                if i % 2:
                    y = ep.ExchangeProducer(ys[4 * i:4 * i + 4].reshape(2, 2))
                else:
                    y = Slot.from_address(y_ptr + 16 * i, (2, 2), dtype="float32", device="cpu")
                pack = layout.pack({"x": x, 2: raw_ptr + 16 * i, "y": y})
                want = (_ptr(x), raw_ptr + 16 * i, y_ptr + 16 * i)
                if pack.data_ptrs != want or pack.uids != (1, 2, 3):
                    bad += 1
                if i % 64 == 0:                              # the C array the backend reads
                    c_ptrs = (ctypes.c_void_p * 3).from_address(pack.pointer_array_address)
                    if tuple(c_ptrs) != want:
                        bad += 1
                checked[t] += 1
            mismatches[t] = bad
        except BaseException as exc:  # noqa: BLE001 - reported below, with the thread number
            failures.append((t, repr(exc)))
            barrier.abort()

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)                              # switch threads as often as possible
    try:
        threads = [threading.Thread(target=worker, args=(t,)) for t in range(N_THREADS)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert not failures, failures
    assert checked == [N_PACKS] * N_THREADS
    assert mismatches == [0] * N_THREADS


def test_threads_packing_without_a_layout():
    results = []

    def worker(t):
        arrays = [np.zeros(3, np.float32) for _ in range(8)]
        ok = True
        for _ in range(500):
            pack = VariantPack.from_mapping({t * 100 + j: a for j, a in enumerate(arrays)})
            ok &= pack.data_ptrs == tuple(_ptr(a) for a in arrays)
            ok &= pack.uids == tuple(t * 100 + j for j in range(8))
        results.append(ok)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == [True] * 8
