#pragma once
// A rank that stops meeting its peers in collectives (stopped, hung in I/O, spinning) would leave
// them waiting forever with no message. Every blocking MPI collective registers here for its
// duration; a watchdog thread ends the whole job, naming this rank and the collective, once one
// has waited longer than the timeout (run config `train.collective_timeout_s`, docs/configs.md).
#include <cstdint>
#include <string>

namespace so {

class CollectiveWatchdog {
 public:
  static constexpr double kDefaultTimeoutSeconds = 1800.0;

  // seconds <= 0 turns the watchdog off. Applies to collectives already waiting too.
  static void set_timeout(double seconds);
  static double timeout();

  // Registers a collective until destroyed. `what` names it and its group ("all_reduce_sum of 1
  // doubles on group 'world' (rank 0 of 2)").
  class Watch {
   public:
    explicit Watch(std::string what);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    uint64_t id_;
  };
};

}  // namespace so
