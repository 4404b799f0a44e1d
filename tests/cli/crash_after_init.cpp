// Test-only: starts MPI as so_train does (MpiSession), then crashes on the rank given, the way
// named, while the other ranks wait in a barrier for it (tests/cli/fatal_signal.sh).
//   crash_after_init segv|abort|heap|bus|fpe|ill RANK
#include <malloc.h>
#include <mpi.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "parallel/communicator.h"

#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SO_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SO_ASAN 1
#endif

namespace {

// Corrupts the size of the heap's top chunk and allocates from it: glibc aborts inside malloc,
// holding the arena lock. ASan's allocator has no such header.
void corrupt_heap() {
#ifdef SO_ASAN
  std::abort();
#else
  auto* p = static_cast<char*>(std::malloc(100000));
  volatile auto* top_size = reinterpret_cast<volatile size_t*>(p + malloc_usable_size(p));
  *top_size = ~size_t{0xf};
  std::printf("%p\n", std::malloc(50000));
#endif
}

}  // namespace

int main(int argc, char** argv) {
  so::MpiSession mpi(&argc, &argv);
  if (argc != 3) return 2;
  const std::string how = argv[1];
  if (mpi.world_rank() == std::atoi(argv[2])) {
    std::fflush(stdout);
    if (how == "segv") *static_cast<volatile int*>(nullptr) = 1;
    if (how == "abort") std::abort();
    if (how == "heap") corrupt_heap();
    if (how == "bus") std::raise(SIGBUS);
    if (how == "fpe") std::raise(SIGFPE);
    if (how == "ill") std::raise(SIGILL);
    return 3;  // not a way to crash
  }
  MPI_Barrier(MPI_COMM_WORLD);  // the job waits for the crashed rank
  return 0;
}
