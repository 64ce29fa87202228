#include "dist/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>

#include "core/error.h"

namespace tetra::dist {
namespace {

constexpr const char* kDefaultLibrary = "libnccl.so.2";

std::string library_name() {
  const char* env = std::getenv("TETRA_NCCL_LIBRARY");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string(kDefaultLibrary);
}

template <typename Fn>
void resolve(void* handle, const std::string& lib, const char* symbol, Fn& out) {
  void* p = dlsym(handle, symbol);
  if (p == nullptr)
    TETRA_FAIL("NCCL library ", lib, " has no symbol ", symbol,
               " (too old? Tetra needs NCCL 2.18 or newer)");
  out = reinterpret_cast<Fn>(p);
}

struct Loaded {
  NcclApi api;
  std::string error;  // empty when loaded
};

Loaded load() {
  Loaded l;
  const std::string lib = library_name();
  // RTLD_LOCAL: NCCL's symbols stay out of the global namespace (torch may load another copy).
  void* handle = dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    l.error = str("cannot load NCCL (", lib, "): ", why != nullptr ? why : "unknown dlopen error",
                  ". Multi-GPU runs need NCCL 2 installed (libnccl2) or TETRA_NCCL_LIBRARY set "
                  "to its path");
    return l;
  }
  try {
    NcclApi& a = l.api;
    resolve(handle, lib, "ncclGetVersion", a.get_version);
    resolve(handle, lib, "ncclGetErrorString", a.get_error_string);
    resolve(handle, lib, "ncclGetUniqueId", a.get_unique_id);
    resolve(handle, lib, "ncclCommInitRank", a.comm_init_rank);
    resolve(handle, lib, "ncclCommDestroy", a.comm_destroy);
    resolve(handle, lib, "ncclCommGetAsyncError", a.comm_get_async_error);
    resolve(handle, lib, "ncclAllReduce", a.all_reduce);
    resolve(handle, lib, "ncclGroupStart", a.group_start);
    resolve(handle, lib, "ncclGroupEnd", a.group_end);
  } catch (const Error& e) {
    l.error = e.what();
    l.api = NcclApi{};
  }
  // The handle is kept for the life of the process: communicators may outlive any owner.
  return l;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

}  // namespace

const NcclApi& nccl() {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw Error(l.error);
  return l.api;
}

bool nccl_available() { return loaded().error.empty(); }

std::string nccl_version_string() {
  int v = 0;
  TETRA_NCCL_CHECK(nccl().get_version(&v));
  // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
  return str(v / 10000, ".", (v / 100) % 100, ".", v % 100);
}

void disable_nvlink_multicast() {
  // Always 0, even over a user's setting: multicast is not allowed on these machines. Called on
  // the constructing thread before any rank thread starts, so no getenv races with it.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
}

}  // namespace tetra::dist
