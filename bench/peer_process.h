#pragma once
// A benchmark peer in a child process (a Python script timing another implementation), spoken to in
// lines: it announces itself with "ready ..." (or "unavailable: why" and exits), then answers each
// request line with one reply line. Every read has a deadline: a stuck peer is killed, not waited for.
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace so::bench {

class PeerProcess {
 public:
  // Starts argv (argv[0] found on PATH) and waits up to start_timeout_s for its first line. On
  // failure the peer is unavailable and why() says why.
  PeerProcess(const std::vector<std::string>& argv, double start_timeout_s);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool available() const { return pid_ > 0; }
  const std::string& banner() const { return banner_; }  // the "ready ..." line, without "ready "
  const std::string& why() const { return why_; }        // why it is unavailable
  // Sends one request line; returns the reply line starting with `expect`, or nullopt (then why()
  // holds the reply or the failure, and a dead or timed-out peer becomes unavailable).
  std::optional<std::string> request(const std::string& line, const std::string& expect, double timeout_s);

 private:
  std::optional<std::string> read_line(double timeout_s);
  void stop(const std::string& why);

  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buffered_, banner_, why_;
};

}  // namespace so::bench
