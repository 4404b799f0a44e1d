#include "so/optim/thread_pool.h"

#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "so/core/cpu_affinity.h"

namespace so {

namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Polls done() for up to `spin`.
template <class Done>
void poll_for(std::chrono::microseconds spin, Done&& done) {
  const auto until = std::chrono::steady_clock::now() + spin;
  for (int i = 0; !done(); ++i) {
    cpu_relax();
    if (i % 64 == 63 && std::chrono::steady_clock::now() >= until) return;
  }
}

}  // namespace

ThreadPool::ThreadPool(std::vector<int> cores) : cores_(std::move(cores)) {
  const int n = cores_.empty() ? 1 : static_cast<int>(cores_.size());
  all_pinned_ = !cores_.empty();
  shares_ = std::vector<Share>(n);
  workers_.reserve(n);
  for (int i = 0; i < n; ++i) workers_.emplace_back([this, i] { worker_main(i); });
  // pinned() must be true only once every worker has actually been moved to its core.
  std::unique_lock lk(mu_);
  done_cv_.wait(lk, [&] { return started_ == n; });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::size() const { return static_cast<int>(workers_.size()); }
const std::vector<int>& ThreadPool::cores() const { return cores_; }
bool ThreadPool::pinned() const { return all_pinned_; }

void ThreadPool::worker_main(int index) {
  const bool ok = !cores_.empty() && pin_current_thread({cores_[index]});
  uint64_t seen = 0;
  std::unique_lock lk(mu_);
  all_pinned_ = all_pinned_ && ok;
  ++started_;
  done_cv_.notify_all();
  for (;;) {
    // Polls for the next loop a little, then sleeps: the optimizer's cores belong to someone else
    // between steps.
    lk.unlock();
    poll_for(kSpin, [&] {
      return stop_.load(std::memory_order_relaxed) || generation_.load(std::memory_order_relaxed) != seen;
    });
    lk.lock();
    work_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto& fn = *fn_;
    lk.unlock();
    const int shares = static_cast<int>(shares_.size());
    for (int k = 0; k < shares; ++k) {  // its own share first, then the others' in turn
      Share& share = shares_[(index + k) % shares];
      for (int64_t i; !failed_.load(std::memory_order_relaxed) && (i = share.next.fetch_add(1)) < share.end;) {
        try {
          fn(i);
        } catch (...) {
          std::lock_guard g(mu_);
          if (!error_) error_ = std::current_exception();
          failed_ = true;  // the other workers stop taking indices
        }
      }
    }
    lk.lock();
    if (--running_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  std::unique_lock lk(mu_);
  fn_ = &fn;
  const int64_t w = size();
  for (int64_t k = 0; k < w; ++k) {
    shares_[k].next = n * k / w;
    shares_[k].end = n * (k + 1) / w;
  }
  failed_ = false;
  error_ = nullptr;
  running_ = size();
  ++generation_;
  work_cv_.notify_all();
  done_cv_.wait(lk, [&] { return running_ == 0; });
  fn_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

}  // namespace so
