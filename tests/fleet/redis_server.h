// A real redis-server for tests: started on a free loopback port in a scratch directory, stopped
// (SIGTERM, then SIGKILL) when the object goes. Tests that need one skip with a message where
// redis-server is not installed outside CI, and fail in CI (scripts/install-deps installs it).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "tokamax/fleet/store.h"

extern char** environ;

namespace tokamax::testing {

// A loopback port nothing listens on now (bound, read back, closed).
inline int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

inline bool have_redis_server() {
  return std::system("command -v redis-server >/dev/null 2>&1") == 0;
}

class RedisServer {
 public:
  // `dir`: where it keeps its snapshot (so a restart on the same port and dir resumes from it).
  explicit RedisServer(const std::string& dir, int port = 0) : dir_(dir), port_(port) {
    if (port_ == 0) port_ = free_port();
    start();
  }
  ~RedisServer() { stop(); }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_) + "/0"; }
  bool running() const { return pid_ > 0; }

  void start() {
    std::filesystem::create_directories(dir_);
    const std::string port = std::to_string(port_);
    const char* argv[] = {"redis-server", "--port",     port.c_str(), "--bind",
                          "127.0.0.1",    "--save",     "",           "--appendonly",
                          "no",           "--dir",      dir_.c_str(), "--dbfilename",
                          "dump.rdb",     "--loglevel", "warning",    nullptr};
    // Its log (warnings about the host's overcommit setting) stays out of the test's output.
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const int rc =
        posix_spawnp(&pid_, "redis-server", &actions, nullptr, const_cast<char**>(argv), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      pid_ = 0;
      return;
    }
    // Up when it answers (at most 5 s).
    for (int i = 0; i < 250; ++i) {
      try {
        auto s = open_store(url(), {0.2, 0.2});
        s->get("ping");
        return;
      } catch (const std::exception&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }
  // Saves a snapshot (SAVE) so that a restart keeps what was published, then stops.
  void stop(bool save = false) {
    if (pid_ <= 0) return;
    if (save) {
      const std::string cmd = "redis-cli -p " + std::to_string(port_) + " save >/dev/null 2>&1";
      if (std::system(cmd.c_str()) != 0) {
        // No snapshot: the restart starts empty (the caller's check will say so).
      }
    }
    kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = 0;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = 0;
};

}  // namespace tokamax::testing
