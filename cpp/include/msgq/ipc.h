// The reference's (commaai/msgq) messaging API, source-compatible: a program
// written against its msgq/ipc.h builds against this header unchanged and
// talks to Python msgq over the same shared memory. Implemented on vipc::
// (vipc/topic.h); differences are listed in docs/cpp.md ("Compatibility").
//
// Error style as in the reference: create() returns nullptr, connect() and
// send() return -1 and set errno (EADDRINUSE: another publisher took the
// topic over, i.e. MultiplePublishersError in Python). Nothing aborts.
// The run prefix comes from MSGQ_PREFIX (or OPENPILOT_PREFIX).
#pragma once

#include <time.h>

#include <cstddef>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "vipc/export.h"

#define MSG_MULTIPLE_PUBLISHERS 100

class VIPC_API Context {
 public:
  static Context* create();
  ~Context() {}
};

// A received (or to be sent) message; owns its bytes.
class VIPC_API Message {
 private:
  char* data = nullptr;
  size_t size = 0;

 public:
  void init(size_t size);
  void init(char* data, size_t size);           // copies
  void takeOwnership(char* data, size_t size);  // data must come from new char[]
  void close();
  size_t getSize() { return size; }
  char* getData() { return data; }
  ~Message();
};

class VIPC_API SubSocket {
 public:
  // endpoint: the topic name; address must be "127.0.0.1" (shared memory is local).
  virtual int connect(Context* context, std::string endpoint, std::string address, bool conflate = false,
                      bool check_endpoint = true, size_t segment_size = 0) = 0;
  // Milliseconds receive() waits; -1 (the default) waits for a message.
  virtual void setTimeout(int timeout) = 0;
  // A new message (delete it), or nullptr when none came in time.
  virtual Message* receive(bool non_blocking = false) = 0;
  static SubSocket* create();
  static SubSocket* create(Context* context, std::string endpoint, std::string address = "127.0.0.1",
                           bool conflate = false, bool check_endpoint = true, size_t segment_size = 0);
  virtual ~SubSocket() {}
};

class VIPC_API PubSocket {
 private:
  struct Impl;
  Impl* impl = nullptr;

 public:
  int connect(Context* context, std::string endpoint, bool check_endpoint = true, size_t segment_size = 0);
  int sendMessage(Message* message);
  int send(char* data, size_t size);  // the size sent, or -1 with errno set
  bool all_readers_updated();
  static PubSocket* create();
  static PubSocket* create(Context* context, std::string endpoint, bool check_endpoint = true, size_t segment_size = 0);
  ~PubSocket();
};

class VIPC_API Poller {
 public:
  virtual void registerSocket(SubSocket* socket) = 0;
  // The registered sockets with a message waiting, after at most `timeout` ms (-1: no limit).
  virtual std::vector<SubSocket*> poll(int timeout) = 0;
  static Poller* create();
  static Poller* create(std::vector<SubSocket*> sockets);
  virtual ~Poller() {}
};
