// msgq._queues: the lossless broadcast queue (broadcast_bindings.cpp) and
// the ordered topic (ordered_bindings.cpp), one module as their C++ halves
// are two folders (cpp/broadcast, cpp/ordered).
#include <pybind11/pybind11.h>

#include "python/bindings.h"
#include "python/queues_bindings.h"

PYBIND11_MODULE(_queues, m) {
  m.doc() = "Native broadcast queue and ordered topic (private: use msgq.broadcast / msgq.ordered)";
  vipc::python::register_error_translator();
  vipc::python::bind_broadcast(m);
  vipc::python::bind_ordered(m);
}
