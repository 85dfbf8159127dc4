// visionipc._visionipc.Frame: the C base of visionipc.frame.VisionBuf.
//
// Why a C base: at a camera's pace a client runs cold right after each wake-up
// (caches and TLBs emptied while it slept), and every Python bytecode and call
// it runs between the wake-up and the pixels costs many times its warm cost
// (BENCHMARKS.md, "cold path"). With the frame's fields in C, Client.recv_into
// stores a received frame's numbers and views without running Python,
// Server.acquire_frame (a producer's get_buffer) makes and fills one the same
// way, Server.send_frame stores what send(buf) changes, and `.array` hands out
// the view prepared before the wait without a Python call.
//
// The fields are plain object slots (readable and writable from Python, as
// VisionBuf's __slots__ were; an unset one raises AttributeError). `_views` is a
// visionipc.frame.FrameViews: a tuple (data, flat, array, spares) whose `spares`
// list holds fresh views of `array` made ahead of time (FrameViews.prepare).
#pragma once

#include <Python.h>

namespace vipc::python {

struct FrameObject {
  PyObject_HEAD PyObject* views;  // FrameViews of the frame's buffer (the owner's cached views)
  PyObject* geometry;             // visionipc.formats.Geometry
  PyObject* idx;
  PyObject* generation;
  PyObject* frame_id;
  PyObject* timestamp_sof;
  PyObject* timestamp_eof;
  PyObject* timestamp_publish;  // CLOCK_MONOTONIC ns of the server's send (0: not received)
  PyObject* timestamp_recv;     // CLOCK_MONOTONIC ns of the client's receive (0: not received)
  PyObject* owner;              // the FrameOwner the frame came from
  PyObject* stream;
  // Not seen from Python: the server's stream handle + 1 that acquire_frame checked
  // the buffer out of (send_frame publishes by it, without a name lookup); 0: none.
  uint64_t server_handle;
};

// FrameViews' fields, in order (visionipc/frame.py).
enum FrameViewsField : Py_ssize_t { kViewsData = 0, kViewsFlat, kViewsArray, kViewsSpares, kViewsFields };

// The type, made once by make_frame_type() (the module holds it).
PyTypeObject* frame_type();
PyObject* make_frame_type();

// Stores `value` (a new reference, or nullptr: then fails) into a field.
bool set_field(PyObject*& field, PyObject* value);

}  // namespace vipc::python
