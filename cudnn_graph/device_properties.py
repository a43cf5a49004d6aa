"""Device properties: a GPU described well enough for cuDNN to plan for it without the GPU (deviceless,
ahead-of-time builds; cuDNN >= 9.8's ``CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR``).

The workflow (docs/prebuilt_plans.md, "Build on a machine without the GPU"):

1. where the GPU is: ``props = create_device_properties(0)``; ``text = props.serialize()``;
2. where it is not (a build machine, ``CUDA_VISIBLE_DEVICES=""``):
   ``props = create_device_properties(text)``; ``g = pygraph(..., device_property=props)``; build the
   graph (cuDNN's heuristics and plan finalization get the descriptor instead of a handle; Python engines
   decline: they need the device); ``blob = g.serialize(as_bytes=True)``;
3. where the GPU is again: ``h = pygraph(); h.deserialize(blob)``; ``h.execute(...)``. The blob carries the
   properties it was built for, and a GPU whose properties differ refuses it
   (``DevicePropertiesMismatchError``).

``serialize()`` wraps cuDNN's JSON with the cuDNN version that wrote it, so text from another cuDNN
(major.minor) is refused with a typed error instead of planning for a GPU that cuDNN reads differently;
cuDNN's bare JSON (what cudnn-frontend's ``serialize()`` returns) is accepted as it is.

Importing this module loads nothing; making or reading properties loads libcudnn (not the GPU, for
``deserialize``).

Example (the GPU machine, then the build machine):
    >>> import cudnn_graph as cudnn
    >>> text = cudnn.create_device_properties(0).serialize()          # doctest: +SKIP
    >>> props = cudnn.create_device_properties(text)                  # doctest: +SKIP
    >>> props.arch, props.device_name                                 # doctest: +SKIP
    (90, 'NVIDIA H200')
"""
from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Mapping, Optional, Union

from .errors import ArgumentTypeError, DevicePropertiesError, DevicePropertiesMismatchError

logger = logging.getLogger(__name__)

__all__ = ["DeviceProperties", "create_device_properties", "MIN_CUDNN_VERSION", "IDENTITY_FIELDS",
           "check_device_matches"]

MIN_CUDNN_VERSION = 90800        # CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR and its attributes
FORMAT = "cudnn_graph.device_properties/1"

# The fields of cuDNN's JSON that say which card and driver it was read from, not what kind of GPU it is:
# a plan built for one H200 runs on any H200, in any slot, under a newer driver. Every other field must
# match for a deviceless plan to run (docs/prebuilt_plans.md).
IDENTITY_FIELDS = frozenset({"cudaDeviceId", "pciDeviceId", "driverVer"})


def _require_version(what: str) -> int:
    """The loaded cuDNN's version; CudnnVersionError (a GraphNotSupportedError) below 9.8."""
    from . import _loader
    from ._cudnn_errors import CudnnVersionError
    version = int(_loader.backend_version())
    if version < MIN_CUDNN_VERSION:
        raise CudnnVersionError(what, MIN_CUDNN_VERSION, version)
    return version


def _same_minor(a: int, b: int) -> bool:
    return a // 100 == b // 100


def _parse_cudnn_json(text: str, where: str) -> dict:
    try:
        fields = json.loads(text)
    except ValueError as exc:
        raise DevicePropertiesError(f"{where}: cuDNN's device-properties JSON is malformed ({exc})", "json") from None
    if not isinstance(fields, dict):
        raise DevicePropertiesError(f"{where}: cuDNN's device-properties JSON is a {type(fields).__name__}, "
                                    f"not an object", "json")
    return fields


class DeviceProperties:
    """One GPU's properties as cuDNN describes them: a finalized device-property descriptor and its JSON.

    Made by ``create_device_properties`` (from a device, a handle, or serialized text) or
    ``DeviceProperties.deserialize``; passed to ``pygraph(device_property=...)``. ``serialize()`` gives the
    text back; ``properties`` is cuDNN's JSON as a dict, ``arch`` the compute capability (90 for sm_90).
    """

    def __init__(self, descriptor: Any, cudnn_json: str, cudnn_version: int, source: str):
        # Private: use create_device_properties() / deserialize(). The descriptor is finalized.
        self.descriptor = descriptor
        self.cudnn_json = cudnn_json
        self.cudnn_version = int(cudnn_version)
        self.source = source
        self.properties: Mapping[str, Any] = _parse_cudnn_json(cudnn_json, source)

    # -- making --------------------------------------------------------------------------------------

    @classmethod
    def from_device(cls, device_id: int = 0) -> "DeviceProperties":
        """The properties of CUDA device ``device_id`` (needs that GPU)."""
        from ._cudnn_descriptor import Descriptor
        version = _require_version("create_device_properties()")
        descriptor = Descriptor("CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR")
        descriptor.set("CUDNN_ATTR_DEVICEPROP_DEVICE_ID", "CUDNN_TYPE_INT32", int(device_id))
        descriptor.finalize()
        return cls(descriptor, _read_json(descriptor), version, f"cuda:{int(device_id)}")

    @classmethod
    def from_handle(cls, handle) -> "DeviceProperties":
        """The properties of the device of ``handle`` (a ``cudnn_graph.Handle`` or a raw cudnnHandle_t int)."""
        from ._cudnn_descriptor import Descriptor
        from ._cudnn_handle import Handle
        if not isinstance(handle, Handle) and (isinstance(handle, bool) or not isinstance(handle, int)):
            raise ArgumentTypeError("create_device_properties(handle=)", "a cuDNN handle (create_handle()) or "
                                    "its int value", type(handle).__name__)
        version = _require_version("create_device_properties()")
        descriptor = Descriptor("CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR")
        descriptor.set("CUDNN_ATTR_DEVICEPROP_HANDLE", "CUDNN_TYPE_HANDLE", handle)
        descriptor.finalize()
        where = f"cuda:{handle.device}" if isinstance(handle, Handle) else f"handle 0x{int(handle):x}"
        return cls(descriptor, _read_json(descriptor), version, where)

    @classmethod
    def deserialize(cls, data: Union[str, bytes, bytearray, memoryview]) -> "DeviceProperties":
        """Properties from ``serialize()``'s text (or cuDNN's bare JSON); needs libcudnn, not the GPU.

        Raises DevicePropertiesError for text that is not device properties, malformed JSON, text from
        another cuDNN major.minor, or JSON cuDNN refuses; CudnnVersionError below cuDNN 9.8.
        """
        from ._cudnn_descriptor import Descriptor
        from ._cudnn_errors import CudnnStatusError
        from .engines.cudnn_backend.engine import _as_chars
        text = _as_text(data)
        version = _require_version("DeviceProperties.deserialize()")
        outer = _parse_cudnn_json(text, "DeviceProperties.deserialize()")
        if outer.get("format") == FORMAT:
            written_by = outer.get("cudnn_version")
            cudnn_json = outer.get("cudnn_json")
            if not isinstance(written_by, int) or not isinstance(cudnn_json, str):
                raise DevicePropertiesError("DeviceProperties.deserialize(): the text lacks its cudnn_version or "
                                            "cudnn_json field (corrupt)", "format")
            if not _same_minor(written_by, version):
                from ._cudnn_errors import format_version
                raise DevicePropertiesError(
                    f"DeviceProperties.deserialize(): these properties were written by cuDNN "
                    f"{format_version(written_by)}; this process has cuDNN {format_version(version)} (device "
                    f"properties are read by the cuDNN major.minor that wrote them: make them again with this "
                    f"cuDNN on the GPU)", "cudnn_version", written_by, version)
        elif "format" in outer and "deviceVer" not in outer:
            raise DevicePropertiesError(f"DeviceProperties.deserialize(): text in format {outer['format']!r}, "
                                        f"not {FORMAT!r}", "format")
        else:       # cuDNN's bare JSON (cudnn-frontend's serialize()): its cuDNN version is not known
            cudnn_json = text
        _parse_cudnn_json(cudnn_json, "DeviceProperties.deserialize()")
        descriptor = Descriptor("CUDNN_BACKEND_DEVICEPROP_DESCRIPTOR")
        try:
            descriptor.set("CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION", "CUDNN_TYPE_CHAR", _as_chars(cudnn_json))
            descriptor.finalize()
        except CudnnStatusError as exc:
            raise DevicePropertiesError(f"DeviceProperties.deserialize(): cuDNN refused the device properties "
                                        f"({exc})", "json") from exc
        return cls(descriptor, cudnn_json, version, "deserialized")

    # -- reading -------------------------------------------------------------------------------------

    def serialize(self, *, as_bytes: bool = False) -> Union[str, bytes]:
        """The text ``deserialize()`` / ``create_device_properties(text)`` reads (``as_bytes``: its UTF-8)."""
        text = json.dumps({"format": FORMAT, "cudnn_version": self.cudnn_version, "cudnn_json": self.cudnn_json},
                          separators=(",", ":"))
        return text.encode("utf-8") if as_bytes else text

    @property
    def arch(self) -> int:
        """The GPU's compute capability as the plan blob stores it: 90 for sm_90 (0 where cuDNN does not say)."""
        value = self.properties.get("deviceVer")
        return int(value) // 10 if isinstance(value, int) else 0

    @property
    def device_name(self) -> str:
        return str(self.properties.get("deviceName", ""))

    @property
    def device_id(self) -> int:
        """The CUDA ordinal the properties were read from (0 where cuDNN does not say)."""
        value = self.properties.get("cudaDeviceId")
        return int(value) if isinstance(value, int) else 0

    @property
    def fingerprint(self) -> str:
        """A short hash of what kind of GPU this is (the identity fields left out): equal GPUs, equal prints."""
        kind = {k: v for k, v in self.properties.items() if k not in IDENTITY_FIELDS}
        return hashlib.sha256(json.dumps(kind, sort_keys=True).encode()).hexdigest()[:16]

    def differences(self, other: "DeviceProperties") -> dict:
        """``{field: (mine, other's)}`` for every property that differs, the identity fields left out."""
        return _differences(self.properties, other.properties)

    def __repr__(self) -> str:
        return (f"DeviceProperties({self.device_name or 'unknown GPU'}, sm_{self.arch}, "
                f"{self.properties.get('multiProcessorCount', '?')} SMs, from {self.source})")


def _differences(built_for: Mapping, here: Mapping) -> dict:
    keys = (set(built_for) | set(here)) - IDENTITY_FIELDS
    return {k: (built_for.get(k), here.get(k)) for k in sorted(keys) if built_for.get(k) != here.get(k)}


def _as_text(data) -> str:
    if isinstance(data, str):
        return data
    if isinstance(data, (bytes, bytearray, memoryview)):
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DevicePropertiesError(f"DeviceProperties.deserialize(): the bytes are not UTF-8 text ({exc})",
                                        "text") from None
    raise ArgumentTypeError("DeviceProperties.deserialize(data)", "the text serialize() returned (str or bytes)",
                            type(data).__name__)


def _read_json(descriptor) -> str:
    size = int(descriptor.count("CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION", "CUDNN_TYPE_CHAR"))
    return descriptor.get_text("CUDNN_ATTR_DEVICEPROP_JSON_REPRESENTATION", max(size, 1))


def create_device_properties(device_id: Union[int, str, bytes] = 0, *, handle=None) -> DeviceProperties:
    """cudnn.create_device_properties: the properties of CUDA device ``device_id`` (needs the GPU), of the
    device of ``handle``, or, given the text ``serialize()`` returned (as cudnn-frontend's
    ``create_device_properties(json)``), those properties (needs libcudnn, not the GPU).

    >>> props = create_device_properties(0)                    # doctest: +SKIP
    >>> again = create_device_properties(props.serialize())    # doctest: +SKIP
    """
    if handle is not None:
        return DeviceProperties.from_handle(handle)
    if isinstance(device_id, (str, bytes, bytearray, memoryview)):
        return DeviceProperties.deserialize(device_id)
    if isinstance(device_id, bool) or not isinstance(device_id, int) or device_id < 0:
        raise ArgumentTypeError("create_device_properties(device_id)", "a CUDA device ordinal (an int >= 0), "
                                "serialized properties, or handle=", device_id)
    return DeviceProperties.from_device(device_id)


def check_device_matches(built_for: Union[DeviceProperties, Mapping], device: int) -> None:
    """Refuse to run a plan built for ``built_for`` (properties, or cuDNN's JSON as a dict) on CUDA device
    ``device`` when that GPU's properties differ: DevicePropertiesMismatchError naming each field."""
    wanted = built_for.properties if isinstance(built_for, DeviceProperties) else built_for
    here = DeviceProperties.from_device(device)
    found = _differences(wanted, here.properties)
    if found:
        raise DevicePropertiesMismatchError(found, f"cuda:{device}")
    logger.debug("the deviceless plan's properties match cuda:%d (%s)", device, here.device_name)


def optional_properties(value: Optional[Any]) -> Optional[DeviceProperties]:
    """``pygraph(device_property=)``'s argument checked: None or a DeviceProperties."""
    if value is None or isinstance(value, DeviceProperties):
        return value
    raise ArgumentTypeError("pygraph(device_property=)", "a DeviceProperties from create_device_properties()",
                            type(value).__name__)


def graph_device(device_property, device, handle) -> tuple:
    """``(properties, device)`` for a pygraph constructor: ``device_property`` checked, and a deviceless graph
    put on the CUDA device its properties describe unless ``device`` or ``handle`` says which."""
    props = optional_properties(device_property)
    if props is not None and device is None and handle is None:
        device = f"cuda:{props.device_id}"
    return props, device


DEVICELESS_DECLINE = ("this graph is planned without its GPU (pygraph(device_property=)); {} plans only on the "
                      "device itself")


def planning_engines(engines, declines: list, report) -> list:
    """The engines that plan a deviceless graph (``BaseEngine.plans_without_device``); every other engine's
    decline is appended to ``declines`` (and ``report(name, why)``ed), so the graph says why it was skipped."""
    kept = []
    for engine in engines:
        if getattr(engine, "plans_without_device", False):
            kept.append(engine)
            continue
        declines.append((engine.name, DEVICELESS_DECLINE.format(engine.name)))
        report(*declines[-1])
    return kept
