#include "fatal_signals.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "so/core/error.h"

namespace so {

namespace {

struct Fatal {
  int sig;
  const char* name;
};
constexpr Fatal kFatal[] = {
    {SIGSEGV, "SIGSEGV"}, {SIGABRT, "SIGABRT"}, {SIGBUS, "SIGBUS"}, {SIGFPE, "SIGFPE"}, {SIGILL, "SIGILL"}};
constexpr int kSignals = sizeof(kFatal) / sizeof(kFatal[0]);

struct sigaction g_before[kSignals];
// The lines are written at install time: the handler may only write(2) what is already there.
char g_lines[kSignals][128];
size_t g_lengths[kSignals];
// A stack overflow leaves no stack for the handler: it runs on this one.
alignas(16) char g_alt_stack[64 * 1024];

extern "C" void on_fatal_signal(int sig, siginfo_t* info, void*) {
  for (int i = 0; i < kSignals; ++i) {
    if (kFatal[i].sig != sig) continue;
    const ssize_t written = ::write(STDERR_FILENO, g_lines[i], g_lengths[i]);
    (void)written;
    // An ignored fatal signal would return into the fault forever: take the default action.
    if (g_before[i].sa_handler == SIG_IGN) g_before[i].sa_handler = SIG_DFL;
    ::sigaction(sig, &g_before[i], nullptr);
  }
  // A fault (si_code > 0) recurs when the handler returns, now reaching the handler put back with
  // its own siginfo; a signal sent by raise/abort/kill must be sent again.
  if (info->si_code > 0) return;
  ::raise(sig);
  ::_exit(128 + sig);
}

}  // namespace

void remember_fatal_signal_handlers() {
  for (int i = 0; i < kSignals; ++i)
    SO_CHECK(::sigaction(kFatal[i].sig, nullptr, &g_before[i]) == 0, "reading the ", kFatal[i].name,
             " handler failed: ", std::strerror(errno));
}

void install_fatal_signal_handlers(int rank) {
  stack_t ss{};
  ss.ss_sp = g_alt_stack;
  ss.ss_size = sizeof(g_alt_stack);
  SO_CHECK(::sigaltstack(&ss, nullptr) == 0, "rank ", rank, ": sigaltstack failed: ", std::strerror(errno));
  for (int i = 0; i < kSignals; ++i) {
    const int n = std::snprintf(g_lines[i], sizeof(g_lines[i]), "fatal signal %s (%s) on rank %d: exiting\n",
                                kFatal[i].name, ::strsignal(kFatal[i].sig), rank);
    g_lengths[i] = static_cast<size_t>(std::clamp<int>(n, 0, sizeof(g_lines[i]) - 1));
    struct sigaction sa {};
    sa.sa_sigaction = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    // SA_NODEFER: the signal raised again from inside the handler acts at once.
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    SO_CHECK(::sigaction(kFatal[i].sig, &sa, nullptr) == 0, "rank ", rank, ": installing the ", kFatal[i].name,
             " handler failed: ", std::strerror(errno));
  }
}

}  // namespace so
