#include "cpu_stream.h"

#include "so/core/clock.h"

namespace so::cpu {

void EventState::complete(uint64_t gen, std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (gen > completed) {
      completed = gen;
      completed_at = now_seconds();
    }
    if (err) error = err;
  }
  cv.notify_all();
}

std::exception_ptr EventState::wait_for(uint64_t gen) {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return completed >= gen; });
  return error;
}

void EventState::wait_recorded() {
  uint64_t gen;
  {
    std::lock_guard<std::mutex> lock(mu);
    gen = recorded;
  }
  if (std::exception_ptr err = wait_for(gen)) std::rethrow_exception(err);
}

CpuStream::CpuStream(StreamKind kind) : kind_(kind), worker_([this] { run(); }) {}

CpuStream::~CpuStream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void CpuStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{std::move(task), nullptr});
  }
  cv_.notify_one();
}

void CpuStream::enqueue_control(std::function<void(std::exception_ptr&)> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Task{nullptr, std::move(task)});
  }
  cv_.notify_one();
}

void CpuStream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;  // reported once; the stream is usable again afterwards
    std::rethrow_exception(e);
  }
}

void CpuStream::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    std::exception_ptr err = error_;
    lock.unlock();
    if (task.control) {
      task.control(err);
    } else if (!err) {
      try {
        task.work();
      } catch (...) {
        err = std::current_exception();
      }
    }
    lock.lock();
    if (err && !error_) error_ = err;
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace so::cpu
