"""The disk cache of compiled kernels (engines/_kernel_disk_cache.py), on the CPU: hits and misses, another
process sees a stored entry, every kind of damaged entry is a miss with a warning that the next store
repairs, concurrent writers and readers of the same keys, the environment's say over where it lives, an
unwritable directory and the size bound."""
from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import pytest

from cudnn_graph.engines import _kernel_disk_cache as kdc
from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey
from cudnn_graph.errors import InvalidArgumentTypeError

LOGGER = kdc.__name__


def key(n: int = 0, **overrides) -> KernelKey:
    fields = dict(engine="cutile", dsl="cuda.tile", dsl_version="1.7.0", driver_version="13000", arch="sm_90",
                  kernel_class={"kernel": "chunk_prepare", "K": 128, "n": n, "knobs": (32, "io")})
    fields.update(overrides)
    return KernelKey(**fields)


def artifact(n: int, writer: int = 0) -> bytes:
    """A payload that says which key and writer it belongs to, and checks itself."""
    body = f"{n}:{writer}:".encode() + bytes(range(256)) * (1 + n % 3)
    return hashlib.sha256(body).digest() + body


def check_artifact(data: bytes, n: int) -> None:
    assert hashlib.sha256(data[32:]).digest() == data[:32], "a torn or foreign payload"
    assert data[32:].split(b":", 1)[0] == str(n).encode(), "another key's payload"


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch, tmp_path):
    """No test writes the user's real cache: the default one lives under tmp_path."""
    monkeypatch.setenv(kdc.ENV_DIR, str(tmp_path / "default-cache"))
    monkeypatch.delenv(kdc.ENV_MAX_BYTES, raising=False)


@pytest.fixture
def cache(tmp_path) -> KernelDiskCache:
    return KernelDiskCache(str(tmp_path / "kernels"))


# -- hits and misses ---------------------------------------------------------------------------------------

def test_a_miss_then_a_stored_entry_loads_with_its_metadata(cache):
    assert cache.enabled
    assert cache.load(key()) is None
    assert cache.store(key(), artifact(0), {"symbol": "chunk_prepare", "regs": [1, 2]})
    assert cache.load(key()) == artifact(0)
    assert cache.entry(key()).meta == {"symbol": "chunk_prepare", "regs": [1, 2]}
    assert cache.counts() == {"hits": 2, "misses": 1, "stores": 1, "rejected": 0, "evicted": 0}
    path = cache.path_for(key())
    assert os.path.isfile(path) and path.startswith(cache.root + os.sep)
    assert os.path.basename(path) == key().digest() + kdc.SUFFIX


def test_a_second_store_of_a_key_replaces_its_entry(cache):
    cache.store(key(), artifact(0, writer=1))
    cache.store(key(), artifact(0, writer=2), {"v": 2})
    assert cache.load(key()) == artifact(0, writer=2)
    assert cache.entry(key()).meta == {"v": 2}
    assert len(os.listdir(os.path.dirname(cache.path_for(key())))) == 1     # no temporary file left


def test_keys_hash_their_canonical_json_so_tuples_lists_and_dict_order_agree():
    a = key(kernel_class={"knobs": (32, "io"), "K": 128})
    b = key(kernel_class={"K": 128, "knobs": [32, "io"]})
    assert a.canonical() == b.canonical() and a.digest() == b.digest()
    assert len(a.digest()) == 64 and int(a.digest(), 16) >= 0
    others = [key(kernel_class={"K": 64, "knobs": [32, "io"]}), key(arch="sm_90a"), key(dsl_version="1.8.0"),
              key(driver_version="13010"), key(engine="cute_gemm"), key(host="aarch64"), key(dsl="cutlass-dsl")]
    assert len({k.digest() for k in others} | {a.digest()}) == len(others) + 1
    assert json.loads(a.canonical())["kernel_class"] == {"K": 128, "knobs": [32, "io"]}


def test_nan_and_infinite_floats_in_a_kernel_class_keep_distinct_keys():
    digests = {key(kernel_class={"lo": v}).digest() for v in (float("nan"), float("inf"), float("-inf"), 0.0)}
    assert len(digests) == 4


@pytest.mark.parametrize("kernel_class", [{"f": object()}, {1: "int key"}, {"s": {1, 2}}, b"bytes"],
                         ids=["object", "int-key", "set", "bytes"])
def test_a_kernel_class_json_cannot_hold_is_refused_naming_it(kernel_class, cache):
    with pytest.raises(InvalidArgumentTypeError, match="kernel_class"):
        key(kernel_class=kernel_class).digest()
    with pytest.raises(InvalidArgumentTypeError, match="kernel_class"):
        cache.store(key(kernel_class=kernel_class), b"x")


def test_a_key_field_that_is_not_a_string_is_refused(cache):
    with pytest.raises(InvalidArgumentTypeError, match="driver_version"):
        key(driver_version=13000).canonical()


def test_bad_data_or_metadata_is_refused_before_anything_is_written(cache):
    with pytest.raises(InvalidArgumentTypeError, match="data"):
        cache.store(key(), "not bytes")
    with pytest.raises(InvalidArgumentTypeError, match="meta"):
        cache.store(key(), b"x", {"when": object()})
    assert not os.path.exists(cache.path_for(key()))


def test_a_second_process_loads_what_the_first_stored(tmp_path):
    root = tmp_path / "shared"
    script = textwrap.dedent("""
        import sys
        from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey
        cache = KernelDiskCache.default()
        k = KernelKey("cutile", "cuda.tile", "1.7.0", "13000", "sm_90", {"kernel": "chunk_output"})
        if sys.argv[1] == "store":
            assert cache.load(k) is None
            assert cache.store(k, b"cubin from process one", {"pid": 1})
        else:
            entry = cache.entry(k)
            print(entry.data.decode(), entry.meta["pid"])
    """)
    env = dict(os.environ, **{kdc.ENV_DIR: str(root)})
    for step in ("store", "load"):
        done = subprocess.run([sys.executable, "-c", script, step], env=env, capture_output=True, text=True,
                              timeout=60, cwd=str(tmp_path))
        assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "cubin from process one 1"


# -- damaged entries ---------------------------------------------------------------------------------------

def _truncate(path, other):
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) - 7])


def _truncate_inside_record(path, other):
    data = open(path, "rb").read()
    open(path, "wb").write(data[:20])


def _flip_payload_byte(path, other):
    data = bytearray(open(path, "rb").read())
    data[-10] ^= 0xFF
    open(path, "wb").write(bytes(data))


def _flip_record_byte(path, other):
    data = bytearray(open(path, "rb").read())
    at = data.index(b'"size":') + len(b'"size":')
    data[at] = ord("9") if data[at] != ord("9") else ord("8")
    open(path, "wb").write(bytes(data))


def _garbage(path, other):
    open(path, "wb").write(os.urandom(4096).replace(b"\n", b"x"))


def _garbage_json_line(path, other):
    open(path, "wb").write(b"[1, 2, 3]\n" + artifact(0))


def _empty(path, other):
    open(path, "wb").close()


def _other_format_version(path, other):
    data = open(path, "rb").read()
    line, payload = data.split(b"\n", 1)
    record = json.loads(line)
    record["format"] = kdc.FORMAT_VERSION + 1
    open(path, "wb").write(json.dumps(record).encode() + b"\n" + payload)


def _swap_with_another_entry(path, other):
    mine, theirs = open(path, "rb").read(), open(other, "rb").read()
    open(path, "wb").write(theirs)
    open(other, "wb").write(mine)


DAMAGE = [_truncate, _truncate_inside_record, _flip_payload_byte, _flip_record_byte, _garbage,
          _garbage_json_line, _empty, _other_format_version, _swap_with_another_entry]


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_entry_is_a_miss_with_a_warning_and_the_next_store_repairs_it(damage, cache, caplog):
    cache.store(key(0), artifact(0), {"n": 0})
    cache.store(key(1), artifact(1), {"n": 1})
    path, other = cache.path_for(key(0)), cache.path_for(key(1))
    damage(path, other)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert cache.load(key(0)) is None
    assert any("invalid" in r.getMessage() and path in r.getMessage() for r in caplog.records), caplog.text
    assert not os.path.exists(path), "an invalid entry is removed"
    assert cache.counts()["rejected"] >= 1
    # the caller compiles again and stores: the entry is whole again
    assert cache.store(key(0), artifact(0), {"n": 0})
    assert cache.load(key(0)) == artifact(0)
    if damage is _swap_with_another_entry:
        assert cache.load(key(1)) is None          # the other file holds key 0's entry: also a miss
        cache.store(key(1), artifact(1))
        check_artifact(cache.load(key(1)), 1)


def test_an_artifact_that_does_not_load_is_discarded_with_a_warning(cache, caplog):
    cache.store(key(), artifact(0))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        cache.discard(key(), "CUDA_ERROR_INVALID_IMAGE")
    assert "CUDA_ERROR_INVALID_IMAGE" in caplog.text
    assert cache.load(key()) is None
    cache.discard(key(), "already gone")           # no entry: nothing to do, no exception


def test_a_damaged_file_replaced_by_another_process_after_the_read_is_kept(cache, monkeypatch):
    """The removal of an invalid entry checks that the file is still the one read: a concurrent writer's
    fresh entry survives."""
    cache.store(key(), artifact(0))
    path = cache.path_for(key())
    _garbage(path, None)
    real_parse = kdc._parse

    def parse_then_replace(blob, canonical):
        found = real_parse(blob, canonical)
        KernelDiskCache(cache.root).store(key(), artifact(0, writer=9))     # "another process"
        return found

    monkeypatch.setattr(kdc, "_parse", parse_then_replace)
    assert cache.load(key()) is None
    monkeypatch.setattr(kdc, "_parse", real_parse)
    assert cache.load(key()) == artifact(0, writer=9)


# -- concurrency -------------------------------------------------------------------------------------------

N_KEYS = 6
STORES = 15


def _writer(root: str, writer: int, errors) -> None:
    cache = KernelDiskCache(root)
    try:
        for i in range(STORES):
            n = (writer + i) % N_KEYS if i % 2 else 0       # key 0 by everyone, the others interleaved
            assert cache.store(key(n), artifact(n, writer), {"writer": writer})
            found = cache.load(key(n))
            assert found is not None
            check_artifact(found, n)
    except BaseException as exc:  # noqa: BLE001  (reported to the parent)
        errors.put(f"writer {writer}: {exc!r}")


def _reader(root: str, deadline: float, errors) -> None:
    cache = KernelDiskCache(root)
    try:
        while time.time() < deadline:
            for n in range(N_KEYS):
                found = cache.entry(key(n))
                if found is not None:
                    check_artifact(found.data, n)
        if cache.counts()["rejected"]:
            errors.put(f"reader saw {cache.counts()['rejected']} invalid entries")
    except BaseException as exc:  # noqa: BLE001
        errors.put(f"reader: {exc!r}")


def test_concurrent_writers_and_readers_of_the_same_keys_see_only_whole_entries(tmp_path):
    root = str(tmp_path / "kernels")
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(root, time.time() + 1.5, errors)) for _ in range(2)]
    writers = [ctx.Process(target=_writer, args=(root, w, errors)) for w in range(4)]
    for p in readers + writers:
        p.start()
    for p in writers + readers:
        p.join(30)
        assert p.exitcode == 0
    problems = []
    while not errors.empty():
        problems.append(errors.get())
    assert not problems, problems
    cache = KernelDiskCache(root)
    for n in range(N_KEYS):
        check_artifact(cache.load(key(n)), n)
    leftovers = [name for folder in os.listdir(root) for name in os.listdir(os.path.join(root, folder))
                 if name.startswith(kdc.TEMP_PREFIX)]
    assert not leftovers
    assert cache.counts()["rejected"] == 0


def test_threads_of_one_process_share_one_cache(cache):
    from concurrent.futures import ThreadPoolExecutor

    def work(t):
        for n in range(N_KEYS):
            cache.store(key(n), artifact(n, t))
            check_artifact(cache.load(key(n)), n)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))        # a failure in a thread raises here
    assert cache.counts()["stores"] == 4 * N_KEYS


# -- where it lives ----------------------------------------------------------------------------------------

def test_the_environment_variable_names_the_directory(monkeypatch, tmp_path):
    monkeypatch.setenv(kdc.ENV_DIR, str(tmp_path / "mine"))
    cache = KernelDiskCache.default()
    assert cache.root == str(tmp_path / "mine") and cache.enabled
    assert KernelDiskCache.default() is cache              # one instance while the environment holds
    cache.store(key(), b"x")
    assert os.path.isfile(cache.path_for(key()))
    monkeypatch.setenv(kdc.ENV_DIR, str(tmp_path / "other"))
    assert KernelDiskCache.default().root == str(tmp_path / "other")


@pytest.mark.parametrize("value", ["", "off", "OFF", "0", "none", " false "])
def test_an_empty_or_off_value_disables_the_cache(monkeypatch, value):
    monkeypatch.setenv(kdc.ENV_DIR, value)
    cache = KernelDiskCache.default()
    assert not cache.enabled and cache.root is None and cache.path_for(key()) is None
    assert cache.store(key(), b"x") is False
    assert cache.load(key()) is None
    assert cache.clear() == 0 and cache.size_bytes() == 0


def test_without_the_variable_the_cache_lives_in_the_user_cache_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(kdc.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert KernelDiskCache.default().root == str(tmp_path / "xdg" / "cudnn_graph" / "kernels")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert KernelDiskCache.default().root == str(tmp_path / "home" / ".cache" / "cudnn_graph" / "kernels")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert KernelDiskCache.default().root == str(tmp_path / "home" / ".cache" / "cudnn_graph" / "kernels")


def test_an_unwritable_directory_warns_once_and_the_cache_works_as_disabled(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cache = KernelDiskCache(str(blocker / "kernels"))     # cannot be made, even by root
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert not cache.enabled
        assert cache.store(key(), b"x") is False
        assert cache.store(key(1), b"y") is False
        assert cache.load(key()) is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "not a writable directory" in warnings[0].getMessage()


def test_a_directory_that_goes_away_under_a_store_disables_the_cache_with_one_warning(cache, caplog):
    assert cache.enabled
    folder = os.path.dirname(cache.path_for(key()))
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    open(folder, "w").close()                 # the entry's folder is now a file: the store cannot write
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert cache.store(key(), b"x") is False
        assert cache.store(key(), b"x") is False
    assert not cache.enabled
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


# -- size bound and housekeeping ---------------------------------------------------------------------------

def _age(cache, k, seconds_ago):
    t = time.time() - seconds_ago
    os.utime(cache.path_for(k), (t, t))


def test_a_store_past_the_size_bound_evicts_the_least_recently_used_entries(tmp_path):
    cache = KernelDiskCache(str(tmp_path / "kernels"), max_bytes=None)
    for n in range(4):
        cache.store(key(n), bytes(1000))
        _age(cache, key(n), 100 - n)           # key 0 is the oldest
    cache.load(key(0))                         # a hit makes key 0 the most recently used
    _age(cache, key(1), 1000)
    entry_size = os.path.getsize(cache.path_for(key(0)))
    bounded = KernelDiskCache(cache.root, max_bytes=3 * entry_size + entry_size // 2)
    bounded.store(key(4), bytes(1000))
    left = {n for n in range(5) if os.path.exists(cache.path_for(key(n)))}
    assert left == {0, 3, 4}, left             # key 1 (aged) and key 2 (oldest after it) went
    assert bounded.counts()["evicted"] == 2
    assert bounded.size_bytes() <= bounded.max_bytes


def test_the_size_bound_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(kdc.ENV_MAX_BYTES, "12345")
    assert KernelDiskCache.default().max_bytes == 12345
    monkeypatch.setenv(kdc.ENV_MAX_BYTES, "0")
    assert KernelDiskCache.default().max_bytes is None
    monkeypatch.setenv(kdc.ENV_MAX_BYTES, "lots")
    assert KernelDiskCache.default().max_bytes == kdc.DEFAULT_MAX_BYTES
    monkeypatch.delenv(kdc.ENV_MAX_BYTES)
    assert KernelDiskCache.default().max_bytes == kdc.DEFAULT_MAX_BYTES


def test_the_newest_entry_is_kept_even_when_it_alone_exceeds_the_bound(tmp_path):
    cache = KernelDiskCache(str(tmp_path / "kernels"), max_bytes=10)
    assert cache.store(key(), bytes(1000))
    assert cache.load(key()) == bytes(1000)


def test_clear_removes_every_entry_and_stale_temporary_files_but_not_a_live_writers(cache):
    for n in range(3):
        cache.store(key(n), artifact(n))
    folder = os.path.dirname(cache.path_for(key(0)))
    stale, live = os.path.join(folder, kdc.TEMP_PREFIX + "dead"), os.path.join(folder, kdc.TEMP_PREFIX + "live")
    for p in (stale, live):
        open(p, "wb").close()
    old = time.time() - 2 * kdc.STALE_TEMP_SECONDS
    os.utime(stale, (old, old))
    assert cache.clear() == 3
    assert all(cache.load(key(n)) is None for n in range(3))
    assert not os.path.exists(stale) and os.path.exists(live)


def test_the_repr_says_where_the_cache_is_and_whether_it_works(cache, tmp_path):
    assert cache.root in repr(cache)
    assert "disabled" in repr(KernelDiskCache(None))
    blocked = tmp_path / "f"
    blocked.write_text("")
    broken = KernelDiskCache(str(blocked / "k"))
    broken.enabled
    assert "unwritable" in repr(broken)
