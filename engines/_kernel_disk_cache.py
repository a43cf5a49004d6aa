"""A disk cache of compiled-kernel artifacts, shared by every process of the user.

A DSL engine (CuTe, cuTile) that compiled a kernel class once can store the artifact it can reload without
compiling (a cubin, a relocatable object) with a small JSON metadata record; the next process that needs
the same class loads it instead of compiling. What the artifact is and how it is reloaded is the engine's
business: this module only keeps bytes safe.

Where: ``$CUDNN_GRAPH_KERNEL_CACHE_DIR`` when set (an empty value, ``off``, ``0``, ``none`` or ``false``
disables the cache), else ``$XDG_CACHE_HOME/cudnn_graph/kernels``, else ``~/.cache/cudnn_graph/kernels``.
Size: at most ``$CUDNN_GRAPH_KERNEL_CACHE_MAX_BYTES`` (default 2 GiB; 0: unbounded); past it a store evicts
the least recently used entries (a hit refreshes an entry's mtime).

Keys: a ``KernelKey`` (engine, DSL name and version, driver version, GPU architecture, host machine, the
kernel class as JSON-able data) hashed with SHA-256. One entry is one file, ``<root>/<2 hex>/<digest>.kernel``:
a one-line JSON record (format version, the full key, payload size and SHA-256, the metadata), a newline,
then the payload. A reader checks all of it, so a hash collision, a swapped, foreign-version, truncated or
corrupt file is a miss: logged as a warning, removed, recompiled by the caller and stored again. Nothing in
here raises to the caller for what it finds on disk.

Writes are atomic: a temporary file in the entry's directory, fsync, ``os.replace``. Readers see the old
file or the new one, never a part; two processes storing one key both write valid entries and the last
replace wins. A cache directory that cannot be written is reported once (a warning) and the cache then
works as disabled.

Example:

    >>> import tempfile
    >>> from cudnn_graph.engines._kernel_disk_cache import KernelDiskCache, KernelKey
    >>> cache = KernelDiskCache(tempfile.mkdtemp())
    >>> key = KernelKey(engine="cutile", dsl="cuda.tile", dsl_version="1.7.0", driver_version="13000",
    ...                 arch="sm_90", kernel_class={"kernel": "chunk_prepare", "K": 128})
    >>> cache.load(key) is None
    True
    >>> cache.store(key, b"\\x7fELF...", {"symbol": "chunk_prepare"})
    True
    >>> cache.load(key)
    b'\\x7fELF...'
    >>> cache.entry(key).meta["symbol"]
    'chunk_prepare'
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import tempfile
import threading
import time
from typing import Any, Mapping, Optional

from ..errors import InvalidArgumentTypeError

logger = logging.getLogger(__name__)

__all__ = ["KernelKey", "KernelEntry", "KernelDiskCache", "ENV_DIR", "ENV_MAX_BYTES", "FORMAT_VERSION"]

ENV_DIR = "CUDNN_GRAPH_KERNEL_CACHE_DIR"
ENV_MAX_BYTES = "CUDNN_GRAPH_KERNEL_CACHE_MAX_BYTES"
FORMAT_VERSION = 1
DEFAULT_MAX_BYTES = 2 << 30
DISABLING_VALUES = frozenset({"", "off", "0", "none", "false", "no"})
SUFFIX = ".kernel"
TEMP_PREFIX = ".tmp-"
STALE_TEMP_SECONDS = 3600.0          # a temporary file this old belongs to a writer that died
MAX_RECORD_BYTES = 1 << 20           # the JSON line; anything longer is not one of ours


def _canonical(value: Any, what: str) -> Any:
    """``value`` as plain JSON data (tuples become lists, mapping keys strings, sorted when dumped);
    InvalidArgumentTypeError naming ``what`` for anything JSON cannot hold exactly."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return {"__float__": repr(value)}      # JSON has no nan / inf; keep them distinct and exact
        return value
    if isinstance(value, (list, tuple)):
        return [_canonical(v, what) for v in value]
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise InvalidArgumentTypeError(what, "JSON-able data (mapping keys are strings)", k)
            out[k] = _canonical(v, what)
        return out
    raise InvalidArgumentTypeError(what, "JSON-able data (None, bool, int, float, str, lists, tuples, "
                                   "str-keyed mappings)", value)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


@dataclasses.dataclass(frozen=True)
class KernelKey:
    """What identifies a compiled kernel across processes.

    ``kernel_class``: what the engine specialises the kernel for (types, majorness, epilogue, knobs,
    alignment class, ...), as JSON-able data (tuples and lists hash alike). ``host``: the CPU the artifact's
    host code (if any) was built for; the default is this machine's. Two keys are the same entry exactly
    when their ``canonical()`` strings are equal.

    >>> KernelKey("cute_gemm", "cutlass-dsl", "4.8.0", "13000", "sm_90a", (("ab", "bfloat16"),),
    ...           host="x86_64").digest()[:12]
    'ce716280c845'
    """

    engine: str
    dsl: str
    dsl_version: str
    driver_version: str
    arch: str
    kernel_class: Any
    host: str = dataclasses.field(default_factory=platform.machine)

    def as_json(self) -> dict:
        """The key as plain JSON data (what an entry stores)."""
        fields = {}
        for f in ("engine", "dsl", "dsl_version", "driver_version", "arch", "host"):
            value = getattr(self, f)
            if not isinstance(value, str):
                raise InvalidArgumentTypeError(f"KernelKey.{f}", "a str", value)
            fields[f] = value
        fields["kernel_class"] = _canonical(self.kernel_class, "KernelKey.kernel_class")
        return fields

    def canonical(self) -> str:
        """The key as one deterministic JSON string."""
        return _dumps(self.as_json())

    def digest(self) -> str:
        """SHA-256 of ``canonical()``, hex: the entry's file name."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class KernelEntry:
    """A verified entry: the artifact's bytes and the metadata stored with them."""
    data: bytes
    meta: dict


def _max_bytes_from_environment() -> Optional[int]:
    raw = os.environ.get(ENV_MAX_BYTES, "").strip()
    if not raw:
        return DEFAULT_MAX_BYTES
    try:
        value = int(raw)
    except ValueError:
        logger.warning("%s=%r is not an integer; using %d", ENV_MAX_BYTES, raw, DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES
    return value if value > 0 else None


def default_root() -> Optional[str]:
    """The cache directory the environment names, or None when the environment disables the cache."""
    override = os.environ.get(ENV_DIR)
    if override is not None:
        if override.strip().lower() in DISABLING_VALUES:
            return None
        return os.path.abspath(os.path.expanduser(override))
    return user_cache_folder("kernels")


def user_cache_folder(leaf: str) -> Optional[str]:
    """``$XDG_CACHE_HOME/cudnn_graph/<leaf>``, else ``~/.cache/cudnn_graph/<leaf>``; None without a home
    (the kernel cache keeps ``kernels``, the plan cache ``plans``)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):            # the XDG rule: a relative value is ignored
        home = os.path.expanduser("~")
        if home == "~" or not os.path.isabs(home):
            return None                    # no home to cache in
        base = os.path.join(home, ".cache")
    return os.path.join(base, "cudnn_graph", leaf)


class KernelDiskCache:
    """Compiled-kernel artifacts under ``root`` (None: a disabled cache, every load a miss, every store a
    no-op). ``max_bytes``: the size bound (None: unbounded). Safe to share between threads and processes.

    ``KernelDiskCache.default()`` is the process's cache as the environment configures it.
    """

    _default: Optional["KernelDiskCache"] = None
    _default_config: Optional[tuple] = None
    _default_lock = threading.Lock()

    def __init__(self, root: Optional[str], max_bytes: Optional[int] = DEFAULT_MAX_BYTES):
        self.root = None if root is None else os.path.abspath(os.fspath(root))
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._usable: Optional[bool] = None if self.root is not None else False
        self._counts = {"hits": 0, "misses": 0, "stores": 0, "rejected": 0, "evicted": 0}

    @classmethod
    def default(cls) -> "KernelDiskCache":
        """The cache the environment configures (``CUDNN_GRAPH_KERNEL_CACHE_DIR``, ``XDG_CACHE_HOME``,
        ``HOME``, ``CUDNN_GRAPH_KERNEL_CACHE_MAX_BYTES``): one instance while those stay the same.

        >>> KernelDiskCache.default().root      # doctest: +SKIP
        '/home/me/.cache/cudnn_graph/kernels'
        """
        config = (default_root(), _max_bytes_from_environment())
        with cls._default_lock:
            if cls._default is None or cls._default_config != config:
                cls._default = cls(*config)
                cls._default_config = config
            return cls._default

    # -- state ------------------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """Whether the cache stores and loads: configured, and its directory writable (checked once; a
        directory that is not is reported by one warning and the cache then works as disabled)."""
        usable = self._usable
        if usable is None:
            with self._lock:
                if self._usable is None:
                    self._usable = self._probe()
                usable = self._usable
        return usable

    def _probe(self) -> bool:
        try:
            os.makedirs(self.root, exist_ok=True)
            fd, path = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=self.root)
            os.close(fd)
            os.unlink(path)
        except OSError as exc:
            logger.warning("kernel disk cache disabled: %s is not a writable directory (%s); compiled "
                           "kernels will not be shared between processes", self.root, exc)
            return False
        return True

    def _disable(self, why: str) -> None:
        with self._lock:
            if self._usable:
                logger.warning("kernel disk cache disabled: %s", why)
            self._usable = False

    def counts(self) -> dict:
        """``{"hits", "misses", "stores", "rejected", "evicted"}`` of this process (rejected: entries found
        invalid and removed)."""
        with self._lock:
            return dict(self._counts)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def path_for(self, key: KernelKey) -> Optional[str]:
        """The file that holds ``key``'s entry (it may not exist), or None for a disabled cache."""
        if self.root is None:
            return None
        digest = key.digest()
        return os.path.join(self.root, digest[:2], digest + SUFFIX)

    # -- reading ----------------------------------------------------------------------------------------

    def load(self, key: KernelKey) -> Optional[bytes]:
        """The artifact stored for ``key``, or None (a miss; also for an invalid entry, which is removed)."""
        found = self.entry(key)
        return None if found is None else found.data

    def entry(self, key: KernelKey) -> Optional[KernelEntry]:
        """The verified entry of ``key`` (artifact and metadata), or None as ``load``."""
        if not self.enabled:
            return None
        canonical = key.canonical()
        path = self.path_for(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self._count("misses")
            return None
        except OSError as exc:
            logger.warning("kernel disk cache: cannot open %s (%s); compiling", path, exc)
            self._count("misses")
            return None
        try:
            with os.fdopen(fd, "rb") as f:
                identity = _identity(os.fstat(f.fileno()))
                blob = f.read()
        except OSError as exc:
            logger.warning("kernel disk cache: cannot read %s (%s); compiling", path, exc)
            self._count("misses")
            return None
        found, why = _parse(blob, canonical)
        if found is None:
            logger.warning("kernel disk cache: %s is invalid (%s); removing it, the kernel is compiled "
                           "again", path, why)
            self._remove_if_unchanged(path, identity)
            self._count("rejected")
            self._count("misses")
            return None
        try:
            os.utime(path)                 # least recently used is by mtime: this one was just used
        except OSError:
            pass
        self._count("hits")
        return found

    def discard(self, key: KernelKey, why: str) -> None:
        """Remove ``key``'s entry because its artifact did not load (``why``): a warning, and the caller
        compiles and stores again."""
        path = self.path_for(key)
        if path is None or not self.enabled:
            return
        logger.warning("kernel disk cache: the artifact in %s did not load (%s); removing it", path, why)
        try:
            os.unlink(path)
            self._count("rejected")
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.debug("cannot remove %s: %s", path, exc)

    def _remove_if_unchanged(self, path: str, identity: tuple) -> None:
        """Unlink ``path`` unless another process replaced it since it was read (its entry is new)."""
        try:
            if _identity(os.stat(path)) == identity:
                os.unlink(path)
        except OSError as exc:
            logger.debug("cannot remove %s: %s", path, exc)

    # -- writing ----------------------------------------------------------------------------------------

    def store(self, key: KernelKey, data: bytes, meta: Optional[Mapping[str, Any]] = None) -> bool:
        """Store ``data`` (the artifact) with ``meta`` (JSON-able) as ``key``'s entry, atomically; True when
        it was written. A failure to write is a warning and leaves the cache disabled, never an exception.
        Bad arguments (not bytes, metadata JSON cannot hold) raise InvalidArgumentTypeError."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgumentTypeError("data", "bytes", type(data).__name__)
        record = {"format": FORMAT_VERSION, "key": key.as_json(),
                  "meta": _canonical(dict(meta or {}), "meta")}
        if not self.enabled:
            return False
        payload = bytes(data)
        record.update(size=len(payload), sha256=hashlib.sha256(payload).hexdigest(), stored=time.time())
        path = self.path_for(key)
        folder = os.path.dirname(path)
        tmp = None
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TEMP_PREFIX, suffix=SUFFIX, dir=folder)
            with os.fdopen(fd, "wb") as f:
                f.write(_dumps(record).encode())
                f.write(b"\n")
                f.write(payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            self._disable(f"cannot write {path} ({exc})")
            return False
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        self._count("stores")
        if self.max_bytes is not None:
            self._evict(keep=path)
        return True

    def _entries(self) -> list:
        """[(mtime, size, path)] of every entry file; stale temporary files are removed on the way."""
        out = []
        now = time.time()
        try:
            folders = [os.path.join(self.root, d) for d in os.listdir(self.root)]
        except OSError:
            return out
        for folder in folders:
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                if name.startswith(TEMP_PREFIX):
                    if now - st.st_mtime > STALE_TEMP_SECONDS:
                        _unlink_quietly(path)
                elif name.endswith(SUFFIX):
                    out.append((st.st_mtime, st.st_size, path))
        return out

    def _evict(self, keep: str) -> None:
        """Remove least recently used entries until the cache holds at most ``max_bytes`` (never ``keep``,
        the entry just stored)."""
        entries = self._entries()
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        removed = 0
        for _, size, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            if _unlink_quietly(path):
                total -= size
                removed += 1
        if removed:
            logger.info("kernel disk cache: evicted %d entries to stay under %d bytes", removed, self.max_bytes)
            self._count("evicted", removed)

    def size_bytes(self) -> int:
        """Bytes the cache's entries take on disk (0 for a disabled cache)."""
        if self.root is None:
            return 0
        return sum(size for _, size, _ in self._entries())

    def clear(self) -> int:
        """Remove every entry (and stale temporary file) and return how many entries went."""
        if self.root is None:
            return 0
        # A young temporary file is a live writer's: it stays (its replace would fail without it).
        return sum(_unlink_quietly(path) for _, _, path in self._entries())

    def __repr__(self) -> str:
        state = "disabled" if self.root is None else (self.root if self._usable is not False else
                                                      f"{self.root} (unwritable: disabled)")
        return f"KernelDiskCache({state})"


def _identity(st: os.stat_result) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def _parse(blob: bytes, canonical: str) -> tuple:
    """``(KernelEntry, "")`` for a valid entry of the key whose canonical form is ``canonical``, else
    ``(None, why)``."""
    end = blob.find(b"\n", 0, MAX_RECORD_BYTES)
    if end < 0:
        return None, "no record line"
    try:
        record = json.loads(blob[:end].decode("ascii"))
    except (UnicodeDecodeError, ValueError) as exc:
        return None, f"unreadable record ({exc})"
    if not isinstance(record, dict):
        return None, "the record is not a JSON object"
    if record.get("format") != FORMAT_VERSION:
        return None, f"format version {record.get('format')!r}, this library reads {FORMAT_VERSION}"
    if not isinstance(record.get("key"), dict) or _dumps(record["key"]) != canonical:
        return None, "it holds another key (a hash collision or a swapped file)"
    payload = blob[end + 1:]
    if record.get("size") != len(payload):
        return None, f"payload of {len(payload)} bytes, the record says {record.get('size')!r} (truncated?)"
    if record.get("sha256") != hashlib.sha256(payload).hexdigest():
        return None, "payload checksum mismatch"
    meta = record.get("meta")
    if not isinstance(meta, dict):
        return None, "metadata is not a JSON object"
    return KernelEntry(payload, meta), ""
