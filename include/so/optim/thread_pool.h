#pragma once
// A fixed set of worker threads, each pinned to one core, running parallel-for loops. The
// optimizer owns one so its threads never compete with the compute stream's BLAS threads.
// Between loops the workers poll for kSpin before they sleep (OpenMP's teams do the same): the
// optimizer runs loops back to back (bucket after bucket, step then cast), and a woken thread on a
// VM takes tens to hundreds of microseconds, as long as a whole step of 2^20 elements.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace so {

class ThreadPool {
 public:
  static constexpr std::chrono::microseconds kSpin{200};

  // One worker per entry of `cores` (pinned to it); an empty list gives one unpinned worker.
  explicit ThreadPool(std::vector<int> cores);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const;
  const std::vector<int>& cores() const;
  bool pinned() const;  // every worker's binding took effect

  // Runs fn(i) for i in [0, n) across the workers and returns when all are done; the first
  // exception thrown by any fn is rethrown here. Not reentrant; one caller at a time.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker_main(int index);

  std::vector<int> cores_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // a new loop (generation_) or stop_
  std::condition_variable done_cv_;  // running_ reached 0, or a worker finished pinning
  // Written under mu_; atomic so that the polling threads may read them without it.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  int started_ = 0;
  bool all_pinned_ = true;
  // The current loop: worker w takes indices from its own contiguous share, [next, end) of
  // shares_[w], then from the others' (the last one out wakes the caller). Contiguous shares keep
  // each worker's memory streams long, as OpenMP's static schedule does; the stealing keeps a
  // slow core from holding the loop up.
  struct alignas(64) Share {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::vector<Share> shares_;
  int running_ = 0;
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace so
