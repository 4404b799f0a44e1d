#include "parallel/collective_watchdog.h"

#include <cerrno>  // program_invocation_short_name (glibc)
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "parallel/communicator.h"
#include "so/core/clock.h"

namespace so {

namespace {

struct Waiting {
  std::string what;
  double since;
};

// One per process, started with the first watched collective, stopped at exit.
class Monitor {
 public:
  static Monitor& get() {
    static Monitor m;
    return m;
  }
  ~Monitor() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void set_timeout(double s) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      timeout_ = s;
    }
    cv_.notify_all();
  }
  double timeout() {
    std::lock_guard<std::mutex> lock(mu_);
    return timeout_;
  }
  uint64_t add(std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    waiting_[next_] = Waiting{std::move(what), now_seconds()};
    return next_++;
  }
  void remove(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    waiting_.erase(id);
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      // Check a few times per timeout (at most once a second), so the job ends soon after it.
      const double period = timeout_ > 0 ? std::min(1.0, timeout_ / 4) : 1.0;
      cv_.wait_for(lock, std::chrono::duration<double>(period));
      if (stop_ || timeout_ <= 0) continue;
      const double now = now_seconds();
      for (const auto& [id, w] : waiting_) {
        if (now - w.since <= timeout_) continue;
        // The format of the programs' own error lines ("so_train: error: ...").
        std::fprintf(stderr,
                     "%s: error: %s has waited %.0f s for the other ranks (train.collective_timeout_s = %g): "
                     "a rank has stopped, hung or died; ending the job\n",
                     program_invocation_short_name, w.what.c_str(), now - w.since, timeout_);
        std::fflush(stderr);
        MpiSession::abort_job(1);
      }
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Waiting> waiting_;
  uint64_t next_ = 0;
  double timeout_ = CollectiveWatchdog::kDefaultTimeoutSeconds;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

void CollectiveWatchdog::set_timeout(double seconds) { Monitor::get().set_timeout(seconds); }
double CollectiveWatchdog::timeout() { return Monitor::get().timeout(); }

CollectiveWatchdog::Watch::Watch(std::string what) : id_(Monitor::get().add(std::move(what))) {}
CollectiveWatchdog::Watch::~Watch() { Monitor::get().remove(id_); }

}  // namespace so
