#include "bench/peer_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "so/core/error.h"

namespace so::bench {

PeerProcess::PeerProcess(const std::vector<std::string>& argv, double start_timeout_s) {
  int in[2], out[2];
  SO_CHECK(pipe(in) == 0 && pipe(out) == 0, "peer: pipe failed: ", std::strerror(errno));
  pid_ = fork();
  SO_CHECK(pid_ >= 0, "peer: fork failed: ", std::strerror(errno));
  if (pid_ == 0) {
    dup2(in[0], STDIN_FILENO);
    dup2(out[1], STDOUT_FILENO);
    dup2(out[1], STDERR_FILENO);
    for (int fd : {in[0], in[1], out[0], out[1]}) close(fd);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::printf("unavailable: cannot run %s: %s\n", argv[0].c_str(), std::strerror(errno));
    std::fflush(stdout);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  to_child_ = in[1];
  from_child_ = out[0];
  // Lines before the banner (warnings of imported libraries) are skipped.
  for (;;) {
    const std::optional<std::string> line = read_line(start_timeout_s);
    if (!line) {
      stop(why_.empty() ? "no answer at start-up" : why_);
      return;
    }
    if (line->rfind("ready ", 0) == 0) {
      banner_ = line->substr(6);
      return;
    }
    if (line->rfind("unavailable: ", 0) == 0) {
      stop(line->substr(13));
      return;
    }
  }
}

PeerProcess::~PeerProcess() { stop(""); }

void PeerProcess::stop(const std::string& why) {
  if (!why.empty()) why_ = why;
  if (to_child_ >= 0) close(to_child_);
  if (from_child_ >= 0) close(from_child_);
  to_child_ = from_child_ = -1;
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  pid_ = -1;
}

std::optional<std::string> PeerProcess::read_line(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const size_t nl = buffered_.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      why_ = "timed out";
      return std::nullopt;
    }
    pollfd p{from_child_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[4096];
    const ssize_t got = read(from_child_, buf, sizeof buf);
    if (got <= 0) {
      why_ = buffered_.empty() ? "exited" : "exited: " + buffered_;
      return std::nullopt;
    }
    buffered_.append(buf, static_cast<size_t>(got));
  }
}

std::optional<std::string> PeerProcess::request(const std::string& line, const std::string& expect, double timeout_s) {
  if (!available()) return std::nullopt;
  const std::string msg = line + "\n";
  if (write(to_child_, msg.data(), msg.size()) != static_cast<ssize_t>(msg.size())) {
    stop("exited");
    return std::nullopt;
  }
  for (;;) {
    std::optional<std::string> reply = read_line(timeout_s);
    if (!reply) {
      stop(why_);
      return std::nullopt;
    }
    if (reply->rfind(expect, 0) == 0) return reply;
    if (reply->rfind("error: ", 0) == 0) {
      why_ = reply->substr(7);
      return std::nullopt;
    }
  }
}

}  // namespace so::bench
