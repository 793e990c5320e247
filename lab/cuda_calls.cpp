// A counter of CUDA runtime and driver API calls, loaded by the driver as a
// CUPTI injection library (CUDA_INJECTION64_PATH=<this .so>). nsys makes no
// reports on the GPU machine; this gives the same facts for a host timeline:
// which CUDA calls an eval makes, how often, and the host time spent in them.
// It sees every copy of the runtime in the process (libmlx links its own,
// and so does our extension) because each one ends in the driver.
//
// It also records every kernel's GPU time (CUPTI's activity records, graph
// kernel nodes included), by kernel name: the GPU side of the same evals.
//
// And a timeline, on CUPTI's clock (cuptiGetTimestamp, the activity
// records' time base): every kernel, memcpy and memset with its GPU start and
// end, and every outermost API call with its host enter and exit (a driver
// call made inside a runtime call is counted, not put on the timeline: the
// runtime call's span holds it, and the host time is not there twice).
//
// Not run on its own: lab/cuda_calls.py (step calls of scripts/gpu_run.sh)
// builds it, preloads it and reads it through ctypes:
//   cc_reset()                    zero the counts, empty the timeline
//   cc_dump(buf, len) -> bytes    "domain<TAB>name<TAB>calls<TAB>ns" lines
//                                 (domain: driver, runtime, or kernel: GPU ns)
//   cc_now() -> ns                the timeline's clock now
//   cc_timeline(path) -> records  the timeline into the file at path, lines
//                                 "kind<TAB>start<TAB>end<TAB>bytes<TAB>name"
//                                 (kind: driver, runtime, kernel, memcpy,
//                                 memset; kernels demangled; memcpy named by
//                                 its direction, HtoD...); -1 if unwritable
#include <cupti.h>
#include <cxxabi.h>

#include <cstdlib>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Stat {
  unsigned long long calls = 0, ns = 0;
};

enum Kind { DRIVER, RUNTIME, KERNEL, MEMCPY, MEMSET };
const char* const kinds[] = {"driver", "runtime", "kernel", "memcpy", "memset"};

struct Span {
  Kind kind;
  const char* name;  // API names are CUPTI's constants; kernels' are interned below
  unsigned long long start, end, bytes;
};

std::mutex mutex;
std::map<std::pair<int, std::string>, Stat>& stats =
    *new std::map<std::pair<int, std::string>, Stat>;
std::vector<Span>& spans = *new std::vector<Span>;
// mangled kernel name -> demangled; never cleared, and std::map's nodes
// stay put: spans keep pointers into it
std::map<std::string, std::string>& kernel_names = *new std::map<std::string, std::string>;
// Enter time of the API call in flight on this thread (calls do not nest
// within one domain; a runtime call's driver calls are the other domain).
thread_local unsigned long long entered[2];

unsigned long long now_ns() {
  uint64_t t = 0;
  cuptiGetTimestamp(&t);
  return t;
}

void CUPTIAPI on_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId,
                      const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  const Kind d = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? RUNTIME : DRIVER;
  if (info->callbackSite == CUPTI_API_ENTER) {
    entered[d] = now_ns();
    return;
  }
  const unsigned long long end = now_ns();
  // functionName: "a global constant", per cupti_callbacks.h
  const char* name = info->functionName ? info->functionName : "?";
  std::lock_guard<std::mutex> lock(mutex);
  Stat& s = stats[{d, name}];
  s.calls += 1;
  s.ns += end - entered[d];
  // a runtime call in flight on this thread encloses this driver call
  if (d == RUNTIME || entered[RUNTIME] == 0) spans.push_back({d, name, entered[d], end, 0});
  if (d == RUNTIME) entered[RUNTIME] = 0;
}

const char* demangled(const char* mangled) {
  auto it = kernel_names.find(mangled);
  if (it == kernel_names.end()) {
    int status = 0;
    char* name = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
    it = kernel_names.emplace(mangled, status == 0 ? name : mangled).first;
    std::free(name);
  }
  return it->second.c_str();
}

// Activity: CUPTI asks for buffers and hands them back filled. The records
// are read through older versions' structs (Kernel9, the first Memcpy and
// Memset): later versions only append fields, so these read newer CUPTIs'.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  static const char* const directions[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA",
                                           "AtoD", "DtoA", "DtoD", "HtoH", "PtoP"};
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel9*>(record);
      Stat& s = stats[{KERNEL, k->name ? k->name : "?"}];
      s.calls += 1;
      s.ns += k->end - k->start;
      spans.push_back({KERNEL, demangled(k->name ? k->name : "?"), k->start, k->end, 0});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy*>(record);
      spans.push_back({MEMCPY, directions[c->copyKind < 11 ? c->copyKind : 0], c->start, c->end, c->bytes});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* m = reinterpret_cast<const CUpti_ActivityMemset*>(record);
      spans.push_back({MEMSET, "memset", m->start, m->end, m->bytes});
    }
  }
  std::free(buffer);
}

}  // namespace

extern "C" {

int InitializeInjection(void) {
  CUpti_SubscriberHandle subscriber;
  if (cuptiSubscribe(&subscriber, on_call, nullptr) != CUPTI_SUCCESS) return 0;
  cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  return 1;
}

void cc_reset(void) {
  cuptiActivityFlushAll(1);  // records of earlier work land before the clear
  std::lock_guard<std::mutex> lock(mutex);
  stats.clear();
  spans.clear();
}

int cc_dump(char* buf, int len) {
  cuptiActivityFlushAll(1);
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [key, s] : stats) {
      out += kinds[key.first] + ("\t" + key.second) + "\t" +
             std::to_string(s.calls) + "\t" + std::to_string(s.ns) + "\n";
    }
  }
  const int n = static_cast<int>(out.size()) < len - 1 ? static_cast<int>(out.size()) : len - 1;
  std::memcpy(buf, out.data(), n);
  buf[n] = 0;
  return n;
}

unsigned long long cc_now(void) { return now_ns(); }

long cc_timeline(const char* path) {
  cuptiActivityFlushAll(1);
  FILE* f = std::fopen(path, "w");
  if (!f) return -1;
  std::lock_guard<std::mutex> lock(mutex);
  for (const Span& s : spans) {
    std::fprintf(f, "%s\t%llu\t%llu\t%llu\t%s\n", kinds[s.kind], s.start, s.end, s.bytes, s.name);
  }
  std::fclose(f);
  return static_cast<long>(spans.size());
}

}  // extern "C"
