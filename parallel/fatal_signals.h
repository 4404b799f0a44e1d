#pragma once
// A fatal signal in any rank ends the process (and so the job) at once, with a line naming the
// signal and the rank. Open MPI's own handlers, installed by MPI_Init, print a backtrace, which
// allocates: after heap corruption (an abort inside malloc, which holds its lock) that deadlocks,
// and the rank, with the job waiting on it, hangs until killed.
namespace so {

// Call before MPI_Init: remembers the handlers in place then (the default action, or a
// sanitizer's, which then still reports the fault).
void remember_fatal_signal_handlers();
// Call after MPI_Init: replaces MPI's handlers for SIGSEGV, SIGABRT, SIGBUS, SIGFPE and SIGILL by
// one that writes a line naming the signal and `rank` to stderr, puts back the remembered handler
// and lets it act (async-signal-safe: no allocation, no locks).
void install_fatal_signal_handlers(int rank);

}  // namespace so
