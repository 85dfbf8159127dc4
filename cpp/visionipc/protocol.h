// What server and client say to each other.
//
// Connection (Unix SOCK_SEQPACKET, abstract namespace, so nothing on disk):
//   1. client -> server: Request {magic, version, kind, stream name}.
//   2. server checks the peer's uid (SO_PEERCRED): its own or one of its
//      allowed_uids, else it answers a Reply with status kDenied and hangs up;
//      likewise kFull / kPeerLimit when admitting the peer would break the
//      per-peer share (a refusal always says why, never a silent hang-up).
//      Otherwise one Reply; for kAttach with three fds attached by
//      SCM_RIGHTS: the pool, the lease table, and the stream's msgq topic
//      segment (a fresh open file description), so an admitted user of
//      another uid needs no file permission; for kList with the stream names.
//      The client checks the server's uid too (its own, root, or one it was
//      told to trust): anyone can bind an abstract socket name first.
//   3. kAttach: the client keeps the connection open; its lease slot lives as
//      long as the connection (the server clears it on hang-up).
// A Reply of another version (or kBadRequest: the server found ours wrong)
// is a version mismatch, reported as such.
// Every field is fixed-size, little-endian, explicitly laid out (no C++
// objects on the wire). The client bounds-checks every field of a Reply.
//
// Frames: one Packet per send on the msgq topic visionipc_<name>_<stream>.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/files.h"

namespace vipc::visionipc {

inline constexpr uint32_t kProtocolMagic = 0x43504956;  // "VIPC"
inline constexpr uint32_t kProtocolVersion = 2;         // 2: the topic segment fd in the attach Reply
inline constexpr size_t kStreamNameCapacity = 128;      // incl. NUL
inline constexpr size_t kListCapacity = 8192;           // stream names, '\n'-separated

// Reply::pool_flags. kPoolInDeviceMemory: the stream's frames live in GPU memory
// (visionipc.cuda, create_buffers(memory="cuda")); the pool holds the metadata,
// the generations and, in buffer 0, the device memory's CUDA IPC descriptor, not
// pixels: a client that cannot read device memory refuses such a stream.
// (0 in a Reply of a server that predates the field: host pixels.)
inline constexpr uint32_t kPoolInDeviceMemory = 1u << 0;
inline constexpr uint32_t kKnownPoolFlags = kPoolInDeviceMemory;

enum class RequestKind : uint32_t { kAttach = 1, kList = 2 };
// kUnknownStream carries the stream names the server has in `list`; kFull:
// every lease slot of the stream (or every pending connection) is taken;
// kPeerLimit: the asking process already holds its share (kMaxClientsPerPeer).
enum class ReplyStatus : uint32_t {
  kOk = 0,
  kUnknownStream = 1,
  kFull = 2,
  kBadRequest = 3,
  kDenied = 4,
  kPeerLimit = 5
};

struct Request {
  uint32_t magic;
  uint32_t version;
  uint32_t kind;
  uint32_t reserved;
  char stream[kStreamNameCapacity];
};

struct Reply {
  uint32_t magic;
  uint32_t version;
  uint32_t status;
  uint32_t lease_slot;  // this connection's slot in the lease table
  uint64_t server_id;   // random per server instance; every Packet carries it
  uint32_t stream_ordinal;
  uint32_t format;
  uint32_t width, height, stride, uv_offset;
  uint64_t buffer_size;
  uint32_t count;
  uint32_t pool_flags;  // kPoolInDeviceMemory, ...: what the pool's frame bytes are (0: host pixels)
  uint64_t slot_size, data_offset, pool_size, lease_table_size;
  uint32_t list_length;  // kList: bytes used in `list`
  char list[kListCapacity];
};

static_assert(sizeof(Request) == 16 + kStreamNameCapacity, "wire format");
static_assert(offsetof(Reply, list) == 100 && offsetof(Reply, slot_size) == 64, "wire format");

struct Packet {
  uint32_t magic;
  uint32_t stream_ordinal;
  uint64_t server_id;
  uint32_t index;
  uint32_t reserved;
  uint64_t generation;
  uint64_t frame_id;
  uint64_t timestamp_sof;
  uint64_t timestamp_eof;
  uint64_t publish_ns;  // CLOCK_MONOTONIC when the server sent it (for latency and recording)
};
static_assert(sizeof(Packet) == 64, "wire format");

// "\0visionipc@PREFIX@NAME" (abstract: the leading NUL keeps it off disk);
// where that does not fit sun_path (long prefix and name),
// "\0visionipc#<128-bit digest of it>".
std::string socket_address(const std::string& prefix, const std::string& name);
// socket_address() as a sockaddr_un; returns its length for bind/connect.
socklen_t socket_sockaddr(const std::string& prefix, const std::string& name, sockaddr_un& sa);
// The reference's topic name: "visionipc_NAME_STREAM".
std::string endpoint_name(const std::string& name, const std::string& stream);

// Fds one message may carry (more received are closed and the message refused).
inline constexpr size_t kMaxFdsPerMessage = 4;
// Send a message with up to kMaxFdsPerMessage fds attached; false if the peer
// is gone (or too many fds were given).
bool send_with_fds(int sock, const void* data, size_t n, const std::vector<int>& fds);
// Receive one message and any fds (closed unless `fds` takes them); returns
// bytes received, 0 on hang-up, -1 on error (errno set).
ssize_t recv_with_fds(int sock, void* data, size_t n, std::vector<common::UniqueFd>& fds);

}  // namespace vipc::visionipc

namespace vipc::visionipc {
// Server and stream names: the project's one name rule (common/names.h) with
// at most kMaxNameLength characters; throws common::Error(kInvalidArgument, "<kind> ...").
// The one limit (Python reads it as _visionipc.MAX_NAME_LENGTH; the socket
// address and the topic name are built from it).
inline constexpr size_t kMaxNameLength = 100;
void check_name(const char* kind, const std::string& name);
}  // namespace vipc::visionipc
