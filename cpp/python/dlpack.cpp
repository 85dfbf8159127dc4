#include "python/dlpack.h"

#include <stdexcept>

namespace vipc::python {

namespace {

namespace py = pybind11;

// What a capsule owns: the DLPack tensor, its shape and strides, and a strong
// reference to the owner. Freed by the deleter, exactly once.
struct Context {
  dl::ManagedTensor managed{};
  std::vector<int64_t> shape, strides;
  PyObject* owner = nullptr;
};

void delete_managed(dl::ManagedTensor* self) {
  auto* ctx = static_cast<Context*>(self->manager_ctx);
  if (Py_IsInitialized()) {
    PyGILState_STATE gil = PyGILState_Ensure();
    Py_XDECREF(ctx->owner);
    PyGILState_Release(gil);
  }
  delete ctx;
}

// The capsule's destructor: an unconsumed capsule frees its tensor; a consumed
// one ("used_dltensor") belongs to the consumer, which calls the deleter.
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<dl::ManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  } else {
    PyErr_Clear();
  }
}

}  // namespace

py::capsule dlpack_capsule(py::object owner, uintptr_t data, const std::vector<int64_t>& shape,
                           const std::vector<int64_t>& strides, uint8_t type_code, uint8_t bits, int32_t device_type,
                           int32_t device_id) {
  if (shape.size() != strides.size()) throw std::invalid_argument("shape and strides differ in length");
  auto* ctx = new Context();
  ctx->shape = shape;
  ctx->strides = strides;
  ctx->owner = owner.release().ptr();  // our reference, dropped by the deleter
  dl::Tensor& t = ctx->managed.dl_tensor;
  t.data = reinterpret_cast<void*>(data);
  t.device = {device_type, device_id};
  t.ndim = static_cast<int32_t>(shape.size());
  t.dtype = {type_code, bits, 1};
  t.shape = ctx->shape.data();
  t.strides = ctx->strides.data();
  t.byte_offset = 0;
  ctx->managed.manager_ctx = ctx;
  ctx->managed.deleter = &delete_managed;
  PyObject* capsule = PyCapsule_New(&ctx->managed, "dltensor", &capsule_destructor);
  if (capsule == nullptr) {
    delete_managed(&ctx->managed);
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(capsule);
}

}  // namespace vipc::python
