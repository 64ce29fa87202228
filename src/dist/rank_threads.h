// One host thread per rank: the way Tetra drives several GPUs from one process. Each thread has
// its rank's device current; the first exception any rank throws is rethrown to the caller.
#pragma once
#include <functional>
#include <vector>

namespace tetra::dist {

// Calls fn(rank) on devices.size() threads, thread `rank` with devices[rank] current, and joins.
void run_on_ranks(const std::vector<int>& devices, const std::function<void(int rank)>& fn);

// Number of CUDA devices this process sees (0 without a driver or GPU; never throws).
int visible_gpu_count();

// 0, 1, ..., n-1.
std::vector<int> first_devices(int n);

}  // namespace tetra::dist
