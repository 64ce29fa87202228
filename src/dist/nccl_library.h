// NCCL, loaded at run time with dlopen("libnccl.so.2"), so the library and every CPU-only binary
// (CI, tests, `tetra check`) build and run on machines without NCCL. Types come from the CUDA
// toolkit's nccl.h; only the handful of entry points Tetra calls are resolved.
#pragma once
#include <nccl.h>

#include <string>

namespace tetra::dist {

// Entry points resolved from the loaded library. Signatures are nccl.h's own (decltype), so a
// mismatch with the header is a compile error, not a crash.
struct NcclApi {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetErrorString) get_error_string = nullptr;
  decltype(&::ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&::ncclCommInitRank) comm_init_rank = nullptr;
  decltype(&::ncclCommDestroy) comm_destroy = nullptr;
  decltype(&::ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
};

// The process-wide NCCL, loaded on first use. Throws tetra::Error naming the library and the
// dlopen message when it cannot be loaded or lacks a symbol. TETRA_NCCL_LIBRARY overrides the
// file name (a full path to a particular libnccl.so).
const NcclApi& nccl();

// True when the library loads; never throws.
bool nccl_available();

// "2.28.3" of the loaded library.
std::string nccl_version_string();

// NVLink multicast (NVLS) is forced off in this process's environment before any communicator
// exists: the shared GPU machines forbid it (a program using it can take a host's GPUs out of
// service). Called by every communicator constructor; harmless to call again.
void disable_nvlink_multicast();

}  // namespace tetra::dist

// Checks an NCCL call: on failure throws tetra::Error with the call and NCCL's message.
#define TETRA_NCCL_CHECK(expr)                                                           \
  do {                                                                                   \
    ncclResult_t tetra_nccl_res_ = (expr);                                               \
    if (tetra_nccl_res_ != ncclSuccess)                                                  \
      ::tetra::detail::throw_error(                                                      \
          __FILE__, __LINE__,                                                            \
          ::tetra::str("NCCL error in " #expr ": ",                                      \
                       ::tetra::dist::nccl().get_error_string(tetra_nccl_res_)));        \
  } while (0)
