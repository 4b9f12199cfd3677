// The trace recorder: a CallObserver that turns each op call into a Chrome trace event and
// streams it into every live session's file.
#include "tokamax/trace/trace.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "op/builtins.h"
#include "tokamax/core/device.h"
#include "tokamax/core/error.h"
#include "tokamax/core/json.h"
#include "tokamax/core/log.h"
#include "tokamax/core/version.h"
#include "tokamax/op/dispatch.h"

namespace tokamax {

// One trace file being written: a temporary file next to the destination, renamed into place by
// finish(). Not thread-safe; the registry's mutex serializes it.
class TraceWriter {
 public:
  explicit TraceWriter(std::string path) : path_(std::move(path)) {
    // The library's one way to create a file (a random name, O_EXCL | O_NOFOLLOW): a symlink
    // planted at a predictable temporary name cannot redirect the trace onto another file.
    int fd = -1;
    try {
      fd = create_temp_file(path_, &tmp_);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("trace path '" + path_ + "': " + e.message());
    }
    f_ = ::fdopen(fd, "w");
    if (!f_) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp_.c_str());
      throw InvalidArgument("trace path '" + path_ + "': cannot open '" + tmp_ + "': " + why);
    }
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 16);
    const Json other = {{"tokamax_version", library_version()},
                        {"device_kind", device_kind()},
                        {"payload_format", kPayloadFormat}};
    const Json process_name = {{"name", "process_name"},
                               {"ph", "M"},
                               {"pid", static_cast<int64_t>(getpid())},
                               {"tid", 0},
                               {"args", {{"name", "tokamax (" + device_kind() + ")"}}}};
    // The metadata event goes first so every op event can be written as ",\n{...}".
    std::fputs(("{\"displayTimeUnit\":\"ms\",\"otherData\":" + other.dump() +
                ",\n\"traceEvents\":[\n" + process_name.dump())
                   .c_str(),
               f_);
  }
  ~TraceWriter() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
  }

  // `now_us`: the event's end on the steady clock. Buffered, but handed to the kernel at least
  // every kFlushUs, so a process that dies leaves all but its last moments in the temporary
  // file (which `tokamax trace extract` reads: complete events are kept).
  void append(const std::string& event, double now_us) {
    if (!f_) return;
    std::fputs(",\n", f_);
    std::fputs(event.c_str(), f_);
    ++events_;
    if (now_us - flushed_us_ >= kFlushUs) {
      std::fflush(f_);
      flushed_us_ = now_us;
    }
  }
  int64_t events() const { return events_; }

  // In a child process after fork(): the file and its buffered events belong to the parent. The
  // descriptor is pointed at /dev/null (so the copied stdio buffer, flushed at the child's exit,
  // goes nowhere) and the writer forgets the file without removing or renaming anything.
  void abandon() {
    if (!f_) return;
    const int null_fd = ::open("/dev/null", O_WRONLY);
    if (null_fd >= 0) {
      ::dup2(null_fd, fileno(f_));
      ::close(null_fd);
    }
    f_ = nullptr;  // the FILE is left open on purpose: closing it would flush the parent's data
  }

  // Footer, flush, fsync, rename. Throws Error; the temporary file is removed on failure.
  void finish() {
    if (!f_) return;
    std::FILE* f = f_;
    f_ = nullptr;
    std::fputs("\n]}\n", f);
    const bool ok = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    const int err = errno;
    std::fclose(f);
    if (!ok || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string why = std::strerror(ok ? errno : err);
      std::remove(tmp_.c_str());
      throw Error("could not write trace '" + path_ + "': " + why);
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_, tmp_;
  static constexpr double kFlushUs = 100e3;
  std::FILE* f_ = nullptr;
  int64_t events_ = 0;
  double flushed_us_ = 0;
};

namespace {

std::string substitute_pid(std::string path) {
  for (size_t i = path.find("%p"); i != std::string::npos; i = path.find("%p", i))
    path.replace(i, 2, std::to_string(getpid()));
  return path;
}

// Microseconds with nanosecond resolution; plain decimal, which JSON and the trace viewers read.
void append_us(std::string& out, double us) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, us, std::chars_format::fixed, 3);
  out.append(buf, r.ptr);
}

// Bumped in a child after fork(): the cached process and thread ids below are then stale.
std::atomic<int> g_fork_generation{0};

struct Ids {
  int generation = -1;
  int64_t pid = 0, tid = 0;
};

const Ids& ids() {
  thread_local Ids ids;
  const int g = g_fork_generation.load(std::memory_order_relaxed);
  if (ids.generation != g) {
    ids = {g, static_cast<int64_t>(getpid()), static_cast<int64_t>(::syscall(SYS_gettid))};
  }
  return ids;
}

class Recorder;
Recorder& recorder();

class Recorder : public CallObserver {
 public:
  Recorder() {
    const char* env = std::getenv("TOKAMAX_TRACE");
    if (env && *env) env_template_ = env;
    env_path_ = substitute_pid(env_template_);
    update();
    // The lock is held across fork() so the child never inherits it held by a thread that does
    // not exist there; the child then lets go of the parent's files (see after_fork_in_child).
    pthread_atfork([] { recorder().mu_.lock(); }, [] { recorder().mu_.unlock(); },
                   [] { recorder().after_fork_in_child(); });
  }
  // Static destruction at normal exit: the environment's trace is completed here, unless the
  // program did so itself (finish_env_trace). A trace that could not be written is said on
  // stderr whatever the log settings (the logger may already be gone at this point of the
  // exit): a destructor cannot change the exit status, so this is the one place left to say
  // it. Programs that must fail on it call finish_env_trace.
  ~Recorder() override {
    set_call_observer(nullptr);
    std::lock_guard<std::mutex> lock(mu_);
    const std::string error = finish_env_locked();
    set_call_observer(nullptr);  // again: finishing updated it
    if (!error.empty() && !env_error_reported_) {
      std::fprintf(stderr, "tokamax: TOKAMAX_TRACE: no trace written: %s\n", error.c_str());
    }
  }

  // finish_env_trace: "" when the trace was written (or there is none), else why not.
  std::string finish_env() {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string error = finish_env_locked();
    env_error_reported_ = !error.empty();  // the program has it now: not said again at exit
    return error;
  }

  void on_call(const std::string& name, const std::string& payload, double start_us, double dur_us,
               const std::string& error) const override {
    // Written by hand in sorted key order (one escape pass over the payload), not through a
    // Json object: this runs on every traced call.
    std::string text;
    text.reserve(payload.size() + name.size() + error.size() + 192);
    text += "{\"args\":{";
    if (!error.empty()) {
      text += "\"error\":";
      append_json_string(text, error);
      text += ',';
    }
    text += "\"payload\":";
    append_json_string(text, payload);
    text += "},\"cat\":\"tokamax\",\"dur\":";
    append_us(text, dur_us);
    text += ",\"name\":";
    append_json_string(text, name);
    text += ",\"ph\":\"X\",\"pid\":";
    const Ids& id = ids();
    text += std::to_string(id.pid);
    text += ",\"tid\":";
    text += std::to_string(id.tid);
    text += ",\"ts\":";
    append_us(text, start_us);
    text += '}';
    std::lock_guard<std::mutex> lock(mu_);
    if (!env_path_.empty() && !env_writer_ && env_error_.empty() && !env_finished_) {
      try {
        env_writer_ = std::make_shared<TraceWriter>(env_path_);
      } catch (const std::exception& e) {
        // Said again at exit, or by finish_env_trace; tokamax's errors without their kind.
        const auto* error = dynamic_cast<const Error*>(&e);
        env_error_ = error ? error->message() : e.what();
        TOKAMAX_LOG("trace", kError, std::string("TOKAMAX_TRACE: ") + e.what());
      }
    }
    const double end_us = start_us + dur_us;
    if (env_writer_) env_writer_->append(text, end_us);
    for (const auto& w : sessions_) w->append(text, end_us);
  }

  void add(std::shared_ptr<TraceWriter> w) {
    std::lock_guard<std::mutex> lock(mu_);
    sessions_.push_back(std::move(w));
    update();
  }
  void remove(const TraceWriter* w) {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase_if(sessions_, [&](const auto& s) { return s.get() == w; });
    update();
  }
  std::mutex& mutex() const { return mu_; }
  bool enabled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return recording();
  }
  const std::string& env_path() const { return env_path_; }

 private:
  // In the child, with mu_ held since the prepare handler. Sessions are the parent's: the child
  // records nothing into them. TOKAMAX_TRACE starts afresh for the child (its own file when the
  // path has %p, its own temporary file in any case).
  void after_fork_in_child() {
    g_fork_generation.fetch_add(1, std::memory_order_relaxed);
    for (const auto& w : sessions_) w->abandon();
    sessions_.clear();
    if (env_writer_) env_writer_->abandon();
    env_writer_.reset();
    env_error_.clear();
    env_error_reported_ = env_finished_ = false;
    env_path_ = substitute_pid(env_template_);
    update();
    mu_.unlock();
  }

  // Completes the environment's trace (once); "" when it was written or there is none, else
  // why not (also when its file could not be created at the first call). Caller holds mu_.
  std::string finish_env_locked() {
    if (env_writer_) {
      try {
        env_writer_->finish();
      } catch (const std::exception& e) {
        const auto* error = dynamic_cast<const Error*>(&e);
        env_error_ = error ? error->message() : e.what();
      }
      env_writer_.reset();
    }
    env_finished_ = true;  // later calls are not recorded into it
    update();
    return env_error_;
  }

  // Caller holds mu_ (or is the constructor).
  void update() { set_call_observer(recording() ? this : nullptr); }
  bool recording() const { return (!env_path_.empty() && !env_finished_) || !sessions_.empty(); }

  mutable std::mutex mu_;
  std::string env_template_, env_path_;
  mutable std::shared_ptr<TraceWriter> env_writer_;
  // Why the environment's trace cannot be written ("" while it can); whether finish_env_trace
  // has handed that to the program; whether the trace has been completed.
  mutable std::string env_error_;
  bool env_error_reported_ = false, env_finished_ = false;
  std::vector<std::shared_ptr<TraceWriter>> sessions_;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

// Starts the environment's recording when the shared library loads, before any op can be
// called. A static link drops this file's initializers with the file when nothing references it
// (the Python module's): start_env_trace, called by ensure_builtins, starts it there.
[[maybe_unused]] const bool g_started = (recorder(), true);

}  // namespace

void start_env_trace() { recorder(); }

void finish_env_trace() {
  const std::string error = recorder().finish_env();
  if (!error.empty()) throw Error("TOKAMAX_TRACE: no trace written: " + error);
}

TraceSession::TraceSession(std::string path)
    : path_(std::move(path)), writer_(std::make_shared<TraceWriter>(path_)) {
  recorder().add(writer_);
}

TraceSession::~TraceSession() {
  try {
    close();
  } catch (const std::exception& e) {
    TOKAMAX_LOG("trace", kError, e.what());
  }
}

void TraceSession::close() {
  recorder().remove(writer_.get());
  std::lock_guard<std::mutex> lock(recorder().mutex());  // an in-flight append finishes first
  writer_->finish();
}

int64_t TraceSession::num_events() const {
  std::lock_guard<std::mutex> lock(recorder().mutex());
  return writer_->events();
}

bool tracing_enabled() { return recorder().enabled(); }

std::string env_trace_path() { return recorder().env_path(); }

}  // namespace tokamax
