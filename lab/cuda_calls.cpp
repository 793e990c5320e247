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
// Not run on its own: lab/cuda_calls.py (step calls of scripts/gpu_run.sh)
// builds it, preloads it and reads it through ctypes:
//   cc_reset()                    zero the counts
//   cc_dump(buf, len) -> bytes    "domain<TAB>name<TAB>calls<TAB>ns" lines
//                                 (domain: driver, runtime, or kernel: GPU ns)
#include <cupti.h>

#include <cstdlib>

#include <chrono>
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

std::mutex mutex;
std::map<std::pair<int, std::string>, Stat>& stats =
    *new std::map<std::pair<int, std::string>, Stat>;
// Enter time of the API call in flight on this thread (calls do not nest
// within one domain; a runtime call's driver calls are the other domain).
thread_local unsigned long long entered[2];

unsigned long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void CUPTIAPI on_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId,
                      const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  const int d = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? 1 : 0;
  if (info->callbackSite == CUPTI_API_ENTER) {
    entered[d] = now_ns();
    return;
  }
  const unsigned long long dt = now_ns() - entered[d];
  std::lock_guard<std::mutex> lock(mutex);
  Stat& s = stats[{d, info->functionName ? info->functionName : "?"}];
  s.calls += 1;
  s.ns += dt;
}

// Kernel activity: CUPTI asks for buffers and hands them back filled.
void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, *size));
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel9*>(record);
    Stat& s = stats[{2, k->name ? k->name : "?"}];
    s.calls += 1;
    s.ns += k->end - k->start;
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
  return 1;
}

void cc_reset(void) {
  cuptiActivityFlushAll(1);  // records of earlier work land before the clear
  std::lock_guard<std::mutex> lock(mutex);
  stats.clear();
}

int cc_dump(char* buf, int len) {
  cuptiActivityFlushAll(1);
  std::string out;
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const auto& [key, s] : stats) {
      static const char* const domains[] = {"driver\t", "runtime\t", "kernel\t"};
      out += domains[key.first] + key.second + "\t" +
             std::to_string(s.calls) + "\t" + std::to_string(s.ns) + "\n";
    }
  }
  const int n = static_cast<int>(out.size()) < len - 1 ? static_cast<int>(out.size()) : len - 1;
  std::memcpy(buf, out.data(), n);
  buf[n] = 0;
  return n;
}

}  // extern "C"
