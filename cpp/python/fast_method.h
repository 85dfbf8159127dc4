// A method whose common calls run natively and whose others run its Python function.
//
// Why: a camera calls VisionIpcServer.get_buffer and send once per frame, cold (right
// after a sleep), and the Python frame of a method written in Python costs there even
// when it only forwards to one native call (issue 36). A FastMethod stands in the
// class for the Python function `func` (the decorator visionipc._visionipc.server_method
// puts it there): `obj.name(...)` calls its `hook` first with obj and the arguments,
// natively; the hook either answers (a result, or an error raised), or declines
// (nullptr, no error set), and then `func(obj, ...)` runs as before. So the Python
// function keeps every form and error; the hook only takes the forms it is sure of.
//
// It is a method descriptor (Py_TPFLAGS_METHOD_DESCRIPTOR): CPython calls it with the
// instance first and makes no bound object for `obj.name(...)`; `obj.name` alone is a
// bound method as a function's would be. __doc__, __name__, __qualname__, __module__
// and __wrapped__ are func's, so help() and inspect.signature() show func's.
#pragma once

#include <Python.h>
#include <structmember.h>

#include <cstddef>

namespace vipc::python {

// The native half of a FastMethod: self, then the call's arguments as vectorcall
// passes them (nargs positional, then one per name in kwnames, which may be null).
// `data` is the FastMethod's own (fast_method_new's). A result (new reference), or
// nullptr with an error set, or nullptr without one: not taken, func runs.
using FastHook = PyObject* (*)(PyObject* data, PyObject* self, PyObject* const* args, Py_ssize_t nargs,
                               PyObject* kwnames);

struct FastMethodObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  FastHook hook;
  PyObject* func;  // the Python function: the slow path, and what help() shows
  PyObject* data;  // the hook's (any object; may be None)
};

namespace fast_method_detail {

__attribute__((hot)) inline PyObject* call(PyObject* callable, PyObject* const* args, size_t nargsf,
                                           PyObject* kwnames) {
  auto* m = reinterpret_cast<FastMethodObject*>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (nargs >= 1) [[likely]] {
    PyObject* got = m->hook(m->data, args[0], args + 1, nargs - 1, kwnames);
    if (got != nullptr || PyErr_Occurred()) return got;
  }
  return PyObject_Vectorcall(m->func, args, nargsf, kwnames);
}

inline PyObject* descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (obj == nullptr || obj == Py_None) return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

inline int traverse(PyObject* self, visitproc visit, void* arg) {
  auto* m = reinterpret_cast<FastMethodObject*>(self);
  Py_VISIT(Py_TYPE(self));
  Py_VISIT(m->func);
  Py_VISIT(m->data);
  return 0;
}

inline int clear(PyObject* self) {
  auto* m = reinterpret_cast<FastMethodObject*>(self);
  Py_CLEAR(m->func);
  Py_CLEAR(m->data);
  return 0;
}

inline void dealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  clear(self);
  type->tp_free(self);
  Py_DECREF(type);
}

// func's attribute of that name (help(), inspect).
template <const char* Name>
PyObject* func_attr(PyObject* self, void*) {
  return PyObject_GetAttrString(reinterpret_cast<FastMethodObject*>(self)->func, Name);
}

inline PyObject* wrapped(PyObject* self, void*) { return Py_NewRef(reinterpret_cast<FastMethodObject*>(self)->func); }

inline PyObject* repr(PyObject* self) {
  return PyUnicode_FromFormat("<native-fronted method %R>", reinterpret_cast<FastMethodObject*>(self)->func);
}

inline constexpr char kDoc[] = "__doc__", kName[] = "__name__", kQualname[] = "__qualname__", kModule[] = "__module__";

inline PyGetSetDef getset[] = {{kDoc, func_attr<kDoc>, nullptr, nullptr, nullptr},
                               {kName, func_attr<kName>, nullptr, nullptr, nullptr},
                               {kQualname, func_attr<kQualname>, nullptr, nullptr, nullptr},
                               {kModule, func_attr<kModule>, nullptr, nullptr, nullptr},
                               {"__wrapped__", wrapped, nullptr, nullptr, nullptr},
                               {nullptr, nullptr, nullptr, nullptr, nullptr}};

inline PyMemberDef members[] = {
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(FastMethodObject, vectorcall), READONLY, nullptr},
    {nullptr, 0, 0, 0, nullptr}};

inline PyType_Slot slots[] = {{Py_tp_dealloc, reinterpret_cast<void*>(dealloc)},
                              {Py_tp_traverse, reinterpret_cast<void*>(traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(clear)},
                              {Py_tp_free, reinterpret_cast<void*>(PyObject_GC_Del)},
                              {Py_tp_call, reinterpret_cast<void*>(PyVectorcall_Call)},
                              {Py_tp_descr_get, reinterpret_cast<void*>(descr_get)},
                              {Py_tp_repr, reinterpret_cast<void*>(repr)},
                              {Py_tp_getset, getset},
                              {Py_tp_members, members},
                              {0, nullptr}};

inline PyType_Spec spec = {"visionipc._visionipc.FastMethod", sizeof(FastMethodObject), 0,
                           Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
                               Py_TPFLAGS_METHOD_DESCRIPTOR | Py_TPFLAGS_IMMUTABLETYPE,
                           slots};

}  // namespace fast_method_detail

// The type (made on first use, kept for the process's life).
inline PyTypeObject* fast_method_type() {
  static PyObject* type = PyType_FromSpec(&fast_method_detail::spec);
  return reinterpret_cast<PyTypeObject*>(type);
}

// A FastMethod in front of `func` (new reference, or nullptr with an error set).
inline PyObject* fast_method_new(FastHook hook, PyObject* func, PyObject* data) {
  PyTypeObject* type = fast_method_type();
  if (type == nullptr) return nullptr;
  if (!PyCallable_Check(func)) {
    PyErr_Format(PyExc_TypeError, "server_method() wraps a function, not %R", func);
    return nullptr;
  }
  auto* m = PyObject_GC_New(FastMethodObject, type);
  if (m == nullptr) return nullptr;
  m->vectorcall = fast_method_detail::call;
  m->hook = hook;
  m->func = Py_NewRef(func);
  m->data = Py_NewRef(data);
  PyObject_GC_Track(m);
  return reinterpret_cast<PyObject*>(m);
}

}  // namespace vipc::python
