// Pin the calling thread's OpenMP team, one thread per CPU (what vLLM-CPU's
// VLLM_CPU_OMP_THREADS_BIND does for its worker). libgomp keeps one pool of threads per
// thread that opens parallel regions and reuses it while the team size stays the same, so
// pinning the team once pins every later parallel region of torch's ops run from this thread.
// The extension links the libgomp.so.1 torch has already loaded: the same pool torch uses.
//
//   bind(cpus, n):  thread i of an n-thread team (the caller is thread 0) -> cpus[i % len]
//   affinity(n):    each team thread's allowed CPUs (what the kernel reports back)

#include <omp.h>
#include <sched.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <torch/csrc/utils/pybind.h>

namespace {

std::vector<int64_t> cpus_of_this_thread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int64_t> out;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> affinity(int64_t n) {
  std::vector<std::vector<int64_t>> out(n);
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    if (t < n) out[t] = cpus_of_this_thread();
  }
  return out;
}

std::vector<std::vector<int64_t>> bind(const std::vector<int64_t>& cpus, int64_t n) {
  if (cpus.empty() || n < 1) throw std::invalid_argument("bind: no CPUs or no threads");
  std::vector<int> failed(n, 0);
#pragma omp parallel num_threads(n)
  {
    const int t = omp_get_thread_num();
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(static_cast<int>(cpus[t % cpus.size()]), &set);
    if (t < n && sched_setaffinity(0, sizeof(set), &set) != 0) failed[t] = 1;
  }
  for (int64_t t = 0; t < n; ++t)
    if (failed[t])
      throw std::runtime_error("sched_setaffinity refused CPU " +
                               std::to_string(cpus[t % cpus.size()]) + " for thread " +
                               std::to_string(t));
  return affinity(n);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("bind", &bind, "pin thread i of this thread's n-thread OpenMP team to cpus[i % len]",
        py::arg("cpus"), py::arg("n"));
  m.def("affinity", &affinity, "each thread's allowed CPUs in this thread's n-thread team",
        py::arg("n"));
}
