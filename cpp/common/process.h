// The calling process's pid, without a system call on every use.
//
// glibc no longer caches getpid(), and the VisionIPC server and client check
// on every frame that they are used by the process that made them (fork
// safety). current_pid() reads a process-wide copy instead: set at the first
// use and refreshed in the child of every fork() by a pthread_atfork handler,
// which runs before fork() returns there, i.e. before any code of the child
// can call current_pid(). A child made by a raw clone() that skips the atfork
// handlers would read its parent's pid: the project makes none.
#pragma once

#include <sys/types.h>

namespace vipc::common {

pid_t current_pid();

}  // namespace vipc::common
