"""The reference's import path: ``from msgq.visionipc import VisionIpcServer, ...``."""

from visionipc import VisionBuf, VisionIpcClient, VisionIpcServer, VisionStreamType, get_endpoint_name

__all__ = ["VisionBuf", "VisionIpcClient", "VisionIpcServer", "VisionStreamType", "get_endpoint_name"]
