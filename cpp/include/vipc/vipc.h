// visionipc's native C++ API (namespace vipc); docs/cpp.md walks through it.
//   vipc/error.h   Error, ErrorKind, Timeout, RunOptions
//   vipc/topic.h   Publisher, Subscriber, Poller (MSGQ topics)
//   vipc/frames.h  FrameServer, FrameClient, WriteBuffer, Frame (VisionIPC)
// The reference's API (commaai/msgq) is beside it: "msgq/ipc.h" and "msgq/visionipc/*.h".
#pragma once

#include "vipc/error.h"
#include "vipc/frames.h"
#include "vipc/topic.h"
