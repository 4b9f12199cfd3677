// A fake Redis server for tests of the client's bounds: a loopback listener whose connections
// each get a thread that reads commands (arrays of bulk strings, as every client sends them) and
// answers each as the test's script says: the reply's bytes (valid RESP or not), sent after a
// delay, or a byte at a time. It misbehaves deterministically: the script decides every byte
// and every pause, so a test that bounds the client's waits does not depend on the machine's load
// for what the server does.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace tokamax::testing {

class FakeRedis {
 public:
  struct Answer {
    std::string bytes;           // sent as given
    double delay_s = 0;          // before the first byte
    double byte_interval_s = 0;  // > 0: one byte at a time, this long apart
  };
  // Called on a connection's thread for each command (its arguments, the name first).
  using Script = std::function<Answer(const std::vector<std::string>& command)>;

  explicit FakeRedis(Script script) : script_(std::move(script)) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listener_, 64) != 0) {
      return;  // port() is 0: the test's connection fails and says so
    }
    socklen_t len = sizeof a;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~FakeRedis() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (acceptor_.joinable()) acceptor_.join();
    for (auto& t : connections_) t.join();
    close(listener_);
  }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  int commands() const { return commands_.load(); }

  static std::string bulk(const std::string& s) {
    // Appended, not "$" + to_string(...): GCC 12 warns (-Wrestrict) on that falsely when inlined.
    std::string out = "$";
    out += std::to_string(s.size());
    out += "\r\n";
    out += s;
    out += "\r\n";
    return out;
  }
  // The reply to INFO server: what the client's version check reads.
  static std::string info_reply() { return bulk("# Server\r\nredis_version:7.0.15\r\n"); }
  // A script that answers INFO at once and every other command with `other`.
  static Script answer_info_then(std::function<Answer(const std::vector<std::string>&)> other) {
    return [other](const std::vector<std::string>& c) {
      if (c[0] == "INFO") return Answer{info_reply()};
      return other(c);
    };
  }

 private:
  // Waits up to s seconds; false when the server is stopping.
  bool pause(double s) {
    std::unique_lock<std::mutex> lock(mu_);
    return !cv_.wait_for(lock, std::chrono::duration<double>(s), [this] { return stop_; });
  }
  bool stopping() {
    std::lock_guard<std::mutex> lock(mu_);
    return stop_;
  }

  void accept_loop() {
    while (!stopping()) {
      pollfd p{listener_, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const int fd = accept(listener_, nullptr, nullptr);
      if (fd < 0) continue;
      connections_.emplace_back([this, fd] {
        serve(fd);
        close(fd);
      });
    }
  }

  // One command from the front of buf (removed), or nothing while it is incomplete.
  static std::optional<std::vector<std::string>> take_command(std::string& buf) {
    size_t pos = 0;
    auto line = [&](char type) -> std::optional<long> {
      const size_t end = buf.find("\r\n", pos);
      if (end == std::string::npos || buf[pos] != type) return std::nullopt;
      const long v = std::stol(buf.substr(pos + 1, end - pos - 1));
      pos = end + 2;
      return v;
    };
    if (buf.empty()) return std::nullopt;
    const auto n = line('*');
    if (!n) return std::nullopt;
    std::vector<std::string> args;
    for (long i = 0; i < *n; ++i) {
      if (pos >= buf.size()) return std::nullopt;
      const auto len = line('$');
      if (!len || buf.size() < pos + *len + 2) return std::nullopt;
      args.push_back(buf.substr(pos, *len));
      pos += *len + 2;
    }
    buf.erase(0, pos);
    return args;
  }

  void serve(int fd) {
    std::string buf;
    char chunk[4096];
    while (!stopping()) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      const ssize_t n = recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return;  // the client closed the connection
      buf.append(chunk, static_cast<size_t>(n));
      while (auto command = take_command(buf)) {
        ++commands_;
        const Answer a = script_(*command);
        if (a.delay_s > 0 && !pause(a.delay_s)) return;
        for (size_t i = 0; i < a.bytes.size();) {
          const size_t k = a.byte_interval_s > 0 ? 1 : a.bytes.size() - i;
          const ssize_t sent = send(fd, a.bytes.data() + i, k, MSG_NOSIGNAL);
          if (sent <= 0) return;
          i += static_cast<size_t>(sent);
          if (a.byte_interval_s > 0 && i < a.bytes.size() && !pause(a.byte_interval_s)) return;
        }
      }
    }
  }

  Script script_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<int> commands_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread acceptor_;
  std::vector<std::thread> connections_;  // only the acceptor adds; joined after it
};

}  // namespace tokamax::testing
