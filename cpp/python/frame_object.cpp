// visionipc._visionipc.Frame (frame_object.h says why it is C).
#include "python/frame_object.h"

#include <structmember.h>

#include <cstddef>

namespace vipc::python {

namespace {

PyTypeObject* the_type = nullptr;

// The object fields, in declaration order (all of FrameObject after the head).
constexpr Py_ssize_t kFieldCount = 11;
static_assert(offsetof(FrameObject, server_handle) == sizeof(PyObject) + kFieldCount * sizeof(PyObject*),
              "FrameObject: the object fields, then server_handle");

PyObject** fields(PyObject* self) { return &reinterpret_cast<FrameObject*>(self)->views; }

int frame_traverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));  // a heap type: its instances keep it alive
  PyObject** f = fields(self);
  for (Py_ssize_t i = 0; i < kFieldCount; i++) Py_VISIT(f[i]);
  return 0;
}

// frame_clear, frame_dealloc and frame_array run per frame: [[gnu::hot]], beside the other
// per-frame functions (.text.hot), so a cold frame touches fewer code pages (issue 36).
[[gnu::hot]] int frame_clear(PyObject* self) {
  PyObject** f = fields(self);
  for (Py_ssize_t i = 0; i < kFieldCount; i++) Py_CLEAR(f[i]);
  return 0;
}

[[gnu::hot]] void frame_dealloc(PyObject* self) {
  PyTypeObject* tp = Py_TYPE(self);
  PyObject_GC_UnTrack(self);
  frame_clear(self);
  tp->tp_free(self);
  Py_DECREF(tp);
}

// `.array`: a fresh numpy view of the buffer shaped for the format; the one
// FrameViews.prepare made ahead of time if there is one, else a new one.
[[gnu::hot]] PyObject* frame_array(PyObject* self, void*) {
  PyObject* views = reinterpret_cast<FrameObject*>(self)->views;
  if (views == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "this frame has no buffer yet (_views is not set)");
    return nullptr;
  }
  if (!PyTuple_Check(views) || PyTuple_GET_SIZE(views) != kViewsFields) {
    PyErr_Format(PyExc_TypeError, "a frame's _views must be a FrameViews, not %s", Py_TYPE(views)->tp_name);
    return nullptr;
  }
  PyObject* spares = PyTuple_GET_ITEM(views, kViewsSpares);
  if (PyList_CheckExact(spares) && PyList_GET_SIZE(spares) > 0) {
    const Py_ssize_t last = PyList_GET_SIZE(spares) - 1;
    PyObject* view = PyList_GET_ITEM(spares, last);
    Py_INCREF(view);
    if (PyList_SetSlice(spares, last, last + 1, nullptr) < 0) {
      Py_DECREF(view);
      return nullptr;
    }
    return view;
  }
  static PyObject* view_name = PyUnicode_InternFromString("view");
  return PyObject_CallMethodNoArgs(PyTuple_GET_ITEM(views, kViewsArray), view_name);
}

#define VIPC_FRAME_FIELD(name, member, doc) {name, T_OBJECT_EX, offsetof(FrameObject, member), 0, doc}
PyMemberDef frame_members[] = {
    VIPC_FRAME_FIELD("_views", views, nullptr),
    VIPC_FRAME_FIELD("_geometry", geometry, nullptr),
    VIPC_FRAME_FIELD("idx", idx, "the buffer's index in the pool"),
    VIPC_FRAME_FIELD("generation", generation, "the buffer's generation for this frame"),
    VIPC_FRAME_FIELD("frame_id", frame_id, nullptr),
    VIPC_FRAME_FIELD("timestamp_sof", timestamp_sof, nullptr),
    VIPC_FRAME_FIELD("timestamp_eof", timestamp_eof, nullptr),
    VIPC_FRAME_FIELD("timestamp_publish", timestamp_publish,
                     "CLOCK_MONOTONIC ns of the server's send (0: not received)"),
    VIPC_FRAME_FIELD("timestamp_recv", timestamp_recv, "CLOCK_MONOTONIC ns of this client's receive (0: not received)"),
    VIPC_FRAME_FIELD("_owner", owner, nullptr),
    VIPC_FRAME_FIELD("stream", stream, nullptr),
    {nullptr, 0, 0, 0, nullptr}};
#undef VIPC_FRAME_FIELD

PyGetSetDef frame_getset[] = {
    {"array", frame_array, nullptr,
     "NV12/I420: (height*3//2, stride) uint8; RGB/BGR: (h, w, 3); GRAY: (h, w); RAW16: (h, w) uint16. "
     "A custom layout whose chroma does not follow the luma directly is the flat buffer. A fresh view each time.",
     nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot frame_slots[] = {
    {Py_tp_doc, const_cast<char*>("The fields of one frame (the C base of visionipc.VisionBuf).")},
    {Py_tp_new, reinterpret_cast<void*>(PyType_GenericNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(frame_dealloc)},
    {Py_tp_traverse, reinterpret_cast<void*>(frame_traverse)},
    {Py_tp_clear, reinterpret_cast<void*>(frame_clear)},
    {Py_tp_free, reinterpret_cast<void*>(PyObject_GC_Del)},
    {Py_tp_members, frame_members},
    {Py_tp_getset, frame_getset},
    {0, nullptr}};

PyType_Spec frame_spec = {"visionipc._visionipc.Frame", sizeof(FrameObject), 0,
                          Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, frame_slots};

}  // namespace

PyTypeObject* frame_type() { return the_type; }

PyObject* make_frame_type() {
  PyObject* t = PyType_FromSpec(&frame_spec);
  the_type = reinterpret_cast<PyTypeObject*>(t);  // the module keeps its reference
  return t;
}

bool set_field(PyObject*& field, PyObject* value) {
  if (value == nullptr) return false;
  Py_XSETREF(field, value);
  return true;
}

}  // namespace vipc::python
