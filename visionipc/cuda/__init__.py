"""Frames on the GPU (``pip install 'visionipc[cuda]'``: NVIDIA's ``cuda-bindings``,
no framework needed; PyTorch, CuPy, JAX and Numba read the results through DLPack
and ``__cuda_array_interface__``).

- ``VisionIpcClient(name, stream, conflate, cuda=True)`` (or ``cuda=<device
  ordinal>``) registers the mapped pool's pages with the CUDA runtime, so
  ``frame.to_device(out=None, stream=None)`` copies a frame into device memory
  straight from the pool at the link's speed, asynchronously, and returns a
  :class:`DeviceFrame`. The frame's read lease is held until that copy has
  completed on the device.
- Host frames speak DLPack too: ``numpy.from_dlpack(frame)``,
  ``torch.from_dlpack(frame)`` share the pool's bytes (device type CPU, or
  CUDA-host once the pool is registered, so a kernel can read them over the link).

Without a driver or a device, ``cuda=True`` raises :class:`CudaUnavailableError`
saying so; the client works as before with ``cuda=False``.
"""

from typing import TYPE_CHECKING, Iterable, Sequence, SupportsInt, Union, cast

import numpy as np

from visionipc.cuda._runtime import CudaError, CudaUnavailableError, runtime
from visionipc.cuda.device_frame import DeviceArray, DeviceBuffer, DeviceFrame, contiguous_strides

if TYPE_CHECKING:
    import numpy.typing as npt


def device_count() -> int:
    """CUDA devices present (CudaUnavailableError without cuda-bindings or a driver)."""
    return runtime().device_count()


def empty(shape: Union[int, Sequence[int]], dtype: "npt.DTypeLike" = np.uint8, device: int = 0) -> DeviceArray:
    """A new C-contiguous array in device memory (freed with its last reference), e.g.
    the ``out=`` of ``frame.to_device`` when no framework is at hand."""
    if np.isscalar(shape):
        shape = (int(cast(SupportsInt, shape)),)
    else:
        shape = tuple(int(n) for n in cast(Iterable[SupportsInt], shape))
    dtype = np.dtype(dtype)
    rt = runtime()
    buf = DeviceBuffer(rt, device, max(1, int(np.prod(shape)) * dtype.itemsize))
    return DeviceArray(buf.ptr, shape, contiguous_strides(shape, dtype.itemsize), dtype, device, buf, None, 0, rt)


def available() -> bool:
    """Whether ``cuda=True`` can work here (cuda-bindings, a driver and a device)."""
    try:
        return device_count() > 0
    except CudaError:
        return False


__all__ = ["CudaError", "CudaUnavailableError", "DeviceArray", "DeviceFrame", "available", "device_count", "empty"]
