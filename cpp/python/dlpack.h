// DLPack capsules for frames: host frames (CPU, or CUDA-host once their pool is
// registered with the CUDA runtime) and device frames (visionipc.cuda).
//
// The structures are DLPack's legacy (unversioned) ABI, which every consumer
// accepts (numpy.from_dlpack, torch.from_dlpack, cupy, jax):
// https://dmlc.github.io/dlpack/latest/c_api.html. A capsule is named
// "dltensor"; a consumer renames it "used_dltensor" and calls the deleter when
// it is done. The deleter drops our reference to the owner (the object that
// keeps the memory alive), taking the GIL, since a consumer may call it from any
// thread.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <vector>

namespace vipc::python {

namespace dl {

enum DeviceType : int32_t { kCPU = 1, kCUDA = 2, kCUDAHost = 3 };
enum TypeCode : uint8_t { kInt = 0, kUInt = 1, kFloat = 2 };

struct Device {
  int32_t device_type;
  int32_t device_id;
};

struct DataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};

struct Tensor {
  void* data;
  Device device;
  int32_t ndim;
  DataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements
  uint64_t byte_offset;
};

struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};

}  // namespace dl

// A "dltensor" capsule over `data` (shape, strides in elements, dtype), keeping
// `owner` alive until the consumer's deleter (or the unconsumed capsule) goes.
pybind11::capsule dlpack_capsule(pybind11::object owner, uintptr_t data, const std::vector<int64_t>& shape,
                                 const std::vector<int64_t>& strides, uint8_t type_code, uint8_t bits,
                                 int32_t device_type, int32_t device_id);

}  // namespace vipc::python
