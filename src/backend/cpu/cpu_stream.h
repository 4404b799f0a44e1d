#pragma once
// A CPU "stream": one worker thread draining a FIFO of tasks, and events that complete when the
// worker reaches them. A task that throws poisons the stream: later tasks are skipped (events
// still complete, carrying the error) so no waiter ever hangs, and the error resurfaces on the
// host at the next synchronize.
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "so/backend/backend.h"

namespace so::cpu {

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t recorded = 0;      // generation handed out by the last record()
  uint64_t completed = 0;     // generation the stream has reached
  double completed_at = 0.0;  // now_seconds() when it did
  std::exception_ptr error;

  void complete(uint64_t gen, std::exception_ptr err);
  // Blocks until generation `gen` completed; returns the error it carried, if any.
  std::exception_ptr wait_for(uint64_t gen);
  // Blocks until the last recorded generation completed; rethrows its error.
  void wait_recorded();
};

class CpuEvent final : public Event {
 public:
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(StreamKind kind);
  ~CpuStream() override;
  StreamKind kind() const override { return kind_; }

  // Regular work: skipped once the stream is poisoned.
  void enqueue(std::function<void()> task);
  // Always runs, with the stream's error (if any): used for event completion.
  void enqueue_control(std::function<void(std::exception_ptr&)> task);
  // Host waits for everything enqueued so far; rethrows the stream's error.
  void synchronize();

 private:
  struct Task {
    std::function<void()> work;
    std::function<void(std::exception_ptr&)> control;
  };
  void run();

  StreamKind kind_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Task> queue_;
  bool busy_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread worker_;
};

}  // namespace so::cpu
