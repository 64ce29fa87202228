#include "server/kernel_tracer.h"

#include <cupti.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

#include "core/error.h"

namespace tetra::server {
namespace {

// The CUPTI entry points the tracer uses, resolved from the dlopen'ed library.
struct CuptiApi {
  void* lib = nullptr;
  CUptiResult (*activity_enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*activity_disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*get_next_record)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*flush_all)(uint32_t) = nullptr;
  CUptiResult (*get_timestamp)(uint64_t*) = nullptr;
  CUptiResult (*result_string)(CUptiResult, const char**) = nullptr;
};

std::mutex g_mu;                     // guards g_records and g_running
std::vector<KernelRecord> g_records;  // filled by CUPTI's buffer-complete callback
bool g_running = false;

constexpr size_t kBufferBytes = 8u << 20;  // CUPTI fills these with records
constexpr size_t kAlign = 8;

std::string cupti_error(const CuptiApi& api, CUptiResult r) {
  const char* s = nullptr;
  if (api.result_string && api.result_string(r, &s) == CUPTI_SUCCESS && s) return s;
  return "CUPTI error " + std::to_string(int(r));
}

const CuptiApi& load_cupti() {
  static CuptiApi api;
  static std::string error;
  static bool tried = false;
  if (tried) {
    if (!api.lib) TETRA_FAIL(error);
    return api;
  }
  tried = true;
  std::vector<std::string> names;
  if (const char* env = std::getenv("TETRA_CUPTI_LIBRARY")) names.push_back(env);
  else
    names = {"libcupti.so", "libcupti.so.13", "/usr/local/cuda/extras/CUPTI/lib64/libcupti.so",
             "/usr/local/cuda/lib64/libcupti.so", "/usr/local/cuda/targets/x86_64-linux/lib/libcupti.so",
             "/usr/local/cuda/targets/sbsa-linux/lib/libcupti.so"};
  std::string tried_list;
  for (const std::string& n : names) {
    api.lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (api.lib) break;
    tried_list += (tried_list.empty() ? "" : ", ") + n;
  }
  if (!api.lib) {
    error = "per-kernel profiling needs libcupti (CUDA toolkit: extras/CUPTI/lib64 or targets/*/lib); "
            "could not load it from " + tried_list + " (set TETRA_CUPTI_LIBRARY to its path)";
    TETRA_FAIL(error);
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(api.lib, name));
    if (!fn) {
      error = std::string("libcupti has no ") + name;
      dlclose(api.lib);
      api.lib = nullptr;
      TETRA_FAIL(error);
    }
  };
  sym(api.activity_enable, "cuptiActivityEnable");
  sym(api.activity_disable, "cuptiActivityDisable");
  sym(api.register_callbacks, "cuptiActivityRegisterCallbacks");
  sym(api.get_next_record, "cuptiActivityGetNextRecord");
  sym(api.flush_all, "cuptiActivityFlushAll");
  sym(api.get_timestamp, "cuptiGetTimestamp");
  sym(api.result_string, "cuptiGetResultString");
  return api;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const CuptiApi& api = load_cupti();
  std::vector<KernelRecord> got;
  CUpti_Activity* rec = nullptr;
  while (api.get_next_record(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    // The CUDA 13 layout; the fields read here sit at the same offsets in the older versions.
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    KernelRecord r;
    r.name = k->name ? k->name : "?";
    r.start_ns = k->start;
    r.end_ns = k->end;
    r.device = k->deviceId;
    r.stream = k->streamId;
    r.graph_id = k->graphId;
    got.push_back(std::move(r));
  }
  std::free(buffer);
  std::lock_guard<std::mutex> l(g_mu);
  if (g_running) g_records.insert(g_records.end(), got.begin(), got.end());
}

}  // namespace

void CuptiKernelSource::start() {
  const CuptiApi& api = load_cupti();
  static bool registered = false;
  if (!registered) {
    const CUptiResult r = api.register_callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) TETRA_FAIL("CUPTI refused the activity buffers: ", cupti_error(api, r));
    registered = true;
  }
  {
    std::lock_guard<std::mutex> l(g_mu);
    g_records.clear();
    g_running = true;
  }
  const CUptiResult r = api.activity_enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r != CUPTI_SUCCESS) {
    std::lock_guard<std::mutex> l(g_mu);
    g_running = false;
    TETRA_FAIL("CUPTI could not record kernels: ", cupti_error(api, r));
  }
}

std::vector<KernelRecord> CuptiKernelSource::stop() {
  const CuptiApi& api = load_cupti();
  api.activity_disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  api.flush_all(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);  // delivers every buffer, also partly filled ones
  std::lock_guard<std::mutex> l(g_mu);
  g_running = false;
  std::vector<KernelRecord> out;
  out.swap(g_records);
  return out;
}

uint64_t CuptiKernelSource::now_ns() {
  const CuptiApi& api = load_cupti();
  uint64_t t = 0;
  api.get_timestamp(&t);
  return t;
}

}  // namespace tetra::server
