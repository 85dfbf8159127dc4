// The two halves of msgq._queues (queues_module.cpp defines the module).
#pragma once

#include <pybind11/pybind11.h>

namespace vipc::python {

void bind_broadcast(pybind11::module_& m);  // broadcast_bindings.cpp
void bind_ordered(pybind11::module_& m);    // ordered_bindings.cpp

}  // namespace vipc::python
