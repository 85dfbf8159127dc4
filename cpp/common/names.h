// The one name rule of the project: every topic, run prefix, VisionIPC server
// and stream name, from Python (msgq.names calls check_name through the msgq
// module) and from the C++ API alike, is checked here.
//
// A name is 1..max_length characters of [A-Za-z0-9_.:-], never contains "..",
// and does not start with '.': so it is one path component, no file name of
// /dev/shm can be reached outside the run's own, and it prints as it is.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace vipc::common {

inline constexpr size_t kMaxTopicNameLength = 128;  // topics, queues, ordered topics
inline constexpr size_t kMaxPrefixLength = 64;      // MSGQ_PREFIX / OPENPILOT_PREFIX
// Every character a name may use (with the two rules on '.' above).
inline constexpr std::string_view kNameCharacters =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:-";

// Every file the project makes in the shared-memory directory is named
// "msgq@REST", or "msgq@PREFIX@REST" under a run prefix: a topic's segment is
// REST = TOPIC ('@' is in no name, so a prefix and a topic never collide).
inline constexpr std::string_view kSegmentPrefix = "msgq@";
inline constexpr std::string_view kSegmentDir = "/dev/shm";  // unless MSGQ_SHM_DIR says otherwise
// "msgq@PREFIX@", or "msgq@" without a run prefix: how every file name of the run starts.
std::string run_segment_prefix(std::string_view prefix);

// Throws Error(kInvalidArgument, "<kind> ...") naming the broken rule, with the
// name's bytes escaped (a name may hold terminal escapes or invalid UTF-8).
void check_name(std::string_view kind, std::string_view name, size_t max_length);

// `text` with control characters, DEL and non-ASCII bytes written as \xNN.
std::string escaped(std::string_view text);

}  // namespace vipc::common
