// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <cstddef>
#include <functional>

namespace deltaflow::core {

// Number of threads parallel_for uses: DELTAFLOW_THREADS if set, else the hardware concurrency.
size_t num_threads();

// Runs fn(begin, end) over [0, n) split into contiguous ranges across the pool, and waits.
// Ranges are at least `grain` long. Calls from inside a worker run inline (no nested parallelism).
void parallel_for(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

}  // namespace deltaflow::core
