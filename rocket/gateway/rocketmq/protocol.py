"""RocketMQ 5's protocol as the gateway speaks it: the service name, status codes, property names, and the protobuf
classes of apache.rocketmq.v2, loaded from rocketmq-python-client's generated *_pb2 modules alone (never the client,
grpcio or OpenTelemetry)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

from rocket.errors import Code, RocketError
from rocket.gateway.rocketmq.signature import DENIED_STATUS

SERVICE = "apache.rocketmq.v2.MessagingService"

MESSAGE_TYPE_OF = {"normal": 1, "fifo": 2, "delay": 3, "transaction": 4}  # rocket's -> apache.rocketmq.v2.MessageType
STATUS_OF_CODE = {  # rocket's error codes -> apache.rocketmq.v2.Code
    Code.UNKNOWN_TOPIC: 40402, Code.WRONG_MESSAGE_TYPE: 40014, Code.BAD_FILTER: 40010, Code.NOT_FOUND: 40400,
    Code.BAD_REQUEST: 40000, Code.BAD_BATCH: 40000, Code.BAD_QUEUE: 40000, Code.UNDECODABLE: 40000,
    Code.OFFSET_OUT_OF_RANGE: 40019, Code.FRAME_TOO_LARGE: 41300, Code.TIMEOUT: 50400, Code.OVERLOADED: 42900,
    Code.UNAVAILABLE: 50001, Code.DISK_FULL: 50001,
    # apache/rocketmq's proxy answers AuthenticationException and AuthorizationException alike (signature.py)
    Code.UNAUTHENTICATED: DENIED_STATUS, Code.PERMISSION_DENIED: DENIED_STATUS,
}
OK = 20000
MESSAGE_NOT_FOUND = 40401
OFFSET_NOT_FOUND = 40404
INVALID_RECEIPT_HANDLE = 40013
INVALID_TRANSACTION_ID = 40008
ILLEGAL_MESSAGE_ID = 40009
MESSAGE_CORRUPTED = 40016
UNSUPPORTED = 50500


def load_protocol() -> tuple[types.ModuleType, types.ModuleType] | None:
    """definition_pb2 and service_pb2 from the installed rocketmq-python-client, without importing the client:
    service_pb2's import of rocketmq.grpc_protocol.definition_pb2 is answered by stand-in packages that are
    removed again once it has loaded."""
    loaded = sys.modules.get("rocketmq.grpc_protocol.service_pb2")
    if loaded is not None:  # the client runs in this process (a test, say): share its classes
        return sys.modules["rocketmq.grpc_protocol.definition_pb2"], loaded
    try:
        spec = importlib.util.find_spec("rocketmq")  # finds the package without running its __init__
        import google.protobuf  # noqa: F401  (the generated modules need it)
    except ImportError:
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    directory = Path(next(iter(spec.submodule_search_locations))) / "grpc_protocol"
    if not (directory / "service_pb2.py").is_file():
        return None
    definition = _load_module("rocket._rocketmq_protocol.definition_pb2", directory / "definition_pb2.py")
    stand_ins = {"rocketmq": types.ModuleType("rocketmq"), "rocketmq.grpc_protocol": types.ModuleType("grpc_protocol")}
    setattr(stand_ins["rocketmq.grpc_protocol"], "definition_pb2", definition)
    setattr(stand_ins["rocketmq"], "grpc_protocol", stand_ins["rocketmq.grpc_protocol"])
    if any(name in sys.modules for name in stand_ins):
        return None  # a partly imported client: do not shadow it
    sys.modules.update(stand_ins)
    try:
        service = _load_module("rocket._rocketmq_protocol.service_pb2", directory / "service_pb2.py")
    finally:
        for name in stand_ins:
            sys.modules.pop(name, None)
    return definition, service


def _load_module(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path} cannot be loaded as a module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[name] = module
    return module


def status_of(error: RocketError) -> int:
    return STATUS_OF_CODE.get(error.code, 50000)


def ms_of(duration, default_s: float) -> int:
    if duration.seconds == 0 and duration.nanos == 0:
        return int(default_s * 1000)
    return duration.seconds * 1000 + duration.nanos // 1_000_000
