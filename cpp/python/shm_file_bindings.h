// The shared-memory file discipline of common/shm_file.h for Python layouts
// (msgq.events' state file and FIFOs), bound into msgq._msgq.
#pragma once

#include <pybind11/pybind11.h>

namespace vipc::python {

void bind_shm_files(pybind11::module_& m);  // shm_file_bindings.cpp

}  // namespace vipc::python
