// What libvisionipc exports: the public classes and functions carry VIPC_API;
// everything else in the library (the core) is hidden, so the ABI is exactly
// the public headers and a program cannot bind to internals by accident.
#pragma once

#define VIPC_API __attribute__((visibility("default")))
