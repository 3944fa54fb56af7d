// c4: records torch.distributed operations in C++, on c10d's own pre/post hooks.
//
// A `Tap` is registered as a process group's pre- and post-hook. On the training thread
// the pre-hook notes the op, its root (the peer of a send/recv), its bytes and the enter
// time; the post-hook arranges for the end time:
// - a callback on the Work's future, for backends whose future completes when the
//   operation has finished (gloo);
// - a thread asking `Work::isCompleted()` every period, for backends whose future
//   completes at enqueue (NCCL: the query reads the CUDA events); it sleeps while nothing
//   runs;
// - a Work without a future (gloo's reduce_scatter, which also does not say it completed
//   before `wait()`): ended at the latest when the rank enters its next operation on the
//   group, the only bound such a Work gives;
// - no Work (c10d completed the operation in the call): ended now.
// None of it takes the GIL or runs Python: a Python hook costs a GIL round trip per call
// (c10d releases the GIL around every operation), a Python future callback one more on
// gloo's thread before it wakes the waiting training thread.
//
// The batching thread drains each tap once per interval: the operations entered since,
// in the order entered (the order their `seq` follows), and the ends of those drained
// earlier while still running.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Hooks.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

namespace {

int64_t wall_clock_ns() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);  // the clock of Python's time.time_ns()
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

// One operation this rank entered; whoever learns it finished writes `end_ns` once.
struct Op {
  uint8_t name = 0;  // c10d::HookOpName
  int64_t root = -1;
  int64_t nbytes = 0;
  int64_t enter_ns = 0;
  std::atomic<int64_t> end_ns{0};

  void end(int64_t now) {
    int64_t running = 0;  // the first end wins: a later bound never moves a real end
    end_ns.compare_exchange_strong(running, now);
  }
};
using OpPtr = std::shared_ptr<Op>;

struct Watched {
  c10::intrusive_ptr<c10d::Work> work;
  OpPtr op;
};

// Never destroyed: the thread may still sleep in it while the process exits.
struct Poller {
  std::mutex mutex;
  std::condition_variable wake;
  std::condition_variable polled;  // after every pass
  uint64_t passes = 0;
  std::vector<Watched> incoming;
  std::chrono::microseconds period{500};
  bool started = false;
  bool stopping = false;
  bool blocked = false;  // the thread waits on `wake`
  std::thread thread;
};

Poller& poller() {
  static Poller* const instance = new Poller();
  return *instance;
}

// Polls with nothing to watch before the thread blocks: a training loop hands over its next
// operation within this, and a notify to a thread that is not blocked costs no system call.
constexpr int kLingerPolls = 64;

void poll_loop(Poller& state) {
  std::vector<Watched> watched;
  int empty_polls = 0;
  std::unique_lock<std::mutex> lock(state.mutex);
  while (!state.stopping) {
    if (watched.empty() && state.incoming.empty()) {
      if (++empty_polls > kLingerPolls) {
        state.blocked = true;
        state.wake.wait(lock);  // nothing ran for a while: sleep until an operation comes
        state.blocked = false;
        empty_polls = 0;
        continue;
      }
    } else {
      empty_polls = 0;
    }
    for (Watched& each : state.incoming) {
      watched.push_back(std::move(each));
    }
    state.incoming.clear();
    const auto period = state.period;
    lock.unlock();
    const int64_t now = wall_clock_ns();
    size_t kept = 0;
    for (Watched& each : watched) {
      bool done = true;  // a Work whose query throws has failed: it ended
      try {
        done = each.work->isCompleted();
      } catch (const std::exception&) {
      }
      if (done) {
        each.op->end(now);
      } else {
        watched[kept++] = std::move(each);
      }
    }
    watched.erase(watched.begin() + static_cast<std::ptrdiff_t>(kept), watched.end());
    std::this_thread::sleep_for(period);
    lock.lock();
    ++state.passes;
    state.polled.notify_all();
  }
}

void watch(c10::intrusive_ptr<c10d::Work> work, OpPtr op) {
  Poller& state = poller();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.incoming.push_back({std::move(work), std::move(op)});
  if (!state.started) {
    state.started = true;
    state.stopping = false;
    state.thread = std::thread(poll_loop, std::ref(state));
  }
  if (state.blocked) {
    state.wake.notify_one();
  }
}

void set_poll_period_us(int64_t period_us) {
  Poller& state = poller();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.period = std::chrono::microseconds(period_us < 1 ? 1 : period_us);
}

// Wait (at most `timeout_us`) until the poller has asked every Work handed to it so far,
// so that what finished before the call is ended when the batching thread drains last.
void settle_polling(int64_t timeout_us) {
  Poller& state = poller();
  py::gil_scoped_release released;
  std::unique_lock<std::mutex> lock(state.mutex);
  if (!state.started || (state.blocked && state.incoming.empty())) {
    return;  // nothing watched
  }
  const uint64_t target = state.passes + 2;  // the pass under way may predate the call
  state.polled.wait_for(lock, std::chrono::microseconds(timeout_us), [&state, target] {
    return state.passes >= target || state.blocked || state.stopping;
  });
}

// Stop the polling thread (at exit); the Works it still watched are let go, their ends unknown.
void stop_polling() {
  Poller& state = poller();
  {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!state.started) {
      return;
    }
    state.stopping = true;
    state.wake.notify_one();
  }
  {
    py::gil_scoped_release released;  // the thread never takes the GIL, but be sure
    state.thread.join();
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  state.incoming.clear();
  state.started = false;
  state.stopping = false;
}

enum class FutureKind : uint8_t { kUnknown, kHas, kNone };

// Operations between their pre- and post-hook at once: one per thread issuing operations on
// the group; more are left by operations that threw after their pre-hook.
constexpr size_t kMaxPending = 64;

// The hooks of one process group and what they recorded since the last drain.
class Tap {
 public:
  Tap(const std::vector<int64_t>& recorded, bool poll) : poll_(poll) {
    for (const int64_t name : recorded) {
      if (name >= 0 && name < static_cast<int64_t>(recorded_.size())) {
        recorded_[static_cast<size_t>(name)] = true;
      }
    }
  }

  void pre(const c10d::PreHookArgs& args) noexcept {
    try {
      const auto name = static_cast<uint8_t>(args.name);
      if (!recorded_[name]) {
        return;
      }
      auto op = std::make_shared<Op>();
      op->name = name;
      op->root = args.root;
      const auto& tensors = args.input_tensors.empty() ? args.output_tensors : args.input_tensors;
      for (const at::Tensor& tensor : tensors) {
        op->nbytes += static_cast<int64_t>(tensor.nbytes());
      }
      op->enter_ns = wall_clock_ns();
      std::lock_guard<std::mutex> lock(mutex_);
      for (const OpPtr& earlier : blind_) {  // the rank went on: those finished by now
        earlier->end(op->enter_ns);
      }
      blind_.clear();
      entered_.emplace_back(next_id_++, op);
      if (pending_.size() >= kMaxPending) {  // an operation that threw before its post-hook
        pending_.erase(pending_.begin());   // stays in flight; its entry is not kept forever
      }
      pending_.emplace_back(args.op_id, std::move(op));
    } catch (...) {
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  void post(const c10d::PostHookArgs& args) noexcept {
    try {
      const auto name = static_cast<uint8_t>(args.name);
      OpPtr op;
      FutureKind kind = FutureKind::kUnknown;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        for (auto it = pending_.rbegin(); it != pending_.rend(); ++it) {
          if (it->first == args.op_id) {
            op = std::move(it->second);
            pending_.erase(std::next(it).base());
            break;
          }
        }
        kind = futures_[name];
      }
      if (!op) {
        return;  // an op kind not recorded
      }
      const c10::intrusive_ptr<c10d::Work>& work = args.work;
      if (!work) {  // c10d completed it in the call
        op->end(wall_clock_ns());
        return;
      }
      c10::intrusive_ptr<c10::ivalue::Future> future;
      if (kind != FutureKind::kNone && (!poll_ || kind == FutureKind::kUnknown)) {
        try {
          future = work->getFuture();
        } catch (const std::exception&) {
        }
        kind = future ? FutureKind::kHas : FutureKind::kNone;
        std::lock_guard<std::mutex> lock(mutex_);
        futures_[name] = kind;  // asked once per op kind when polling
      }
      if (kind == FutureKind::kNone) {
        std::lock_guard<std::mutex> lock(mutex_);
        blind_.push_back(std::move(op));
      } else if (poll_) {
        watch(work, std::move(op));
      } else {
        future->addCallback(
            [op = std::move(op)](c10::ivalue::Future& /*done*/) { op->end(wall_clock_ns()); },
            /*uses_future=*/false);
      }
    } catch (...) {
      errors_.fetch_add(1, std::memory_order_relaxed);
    }
  }

  // (entered since the last drain: (id, name, root, bytes, enter_ns, end_ns or 0), in the
  // order entered; (id, end_ns) of those drained earlier that ended since; hook errors).
  py::tuple drain() {
    std::deque<std::pair<uint64_t, OpPtr>> fresh;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fresh.swap(entered_);
    }
    py::list ended;
    for (auto it = open_.begin(); it != open_.end();) {
      const int64_t end = it->second->end_ns.load();
      if (end > 0) {
        ended.append(py::make_tuple(it->first, end));
        it = open_.erase(it);
      } else {
        ++it;
      }
    }
    py::list entered;
    for (auto& [id, op] : fresh) {
      const int64_t end = op->end_ns.load();
      entered.append(py::make_tuple(id, op->name, op->root, op->nbytes, op->enter_ns, end));
      if (end == 0) {
        open_.emplace(id, std::move(op));
      }
    }
    return py::make_tuple(entered, ended, errors_.load(std::memory_order_relaxed));
  }

  // The operations without a future still waiting for a next one end now (at close: the
  // training returned from every call).
  void end_blind(int64_t now) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const OpPtr& op : blind_) {
      op->end(now);
    }
    blind_.clear();
  }

 private:
  std::mutex mutex_;  // the hooks' state: held for a few stores, never across a call out
  const bool poll_;
  std::array<bool, 256> recorded_{};
  std::array<FutureKind, 256> futures_{};
  uint64_t next_id_ = 0;
  std::deque<std::pair<uint64_t, OpPtr>> entered_;  // not drained yet
  std::vector<std::pair<int64_t, OpPtr>> pending_;  // pre-hook ran, post-hook not yet
  std::vector<OpPtr> blind_;  // Works without a future, ended by the next operation
  std::unordered_map<uint64_t, OpPtr> open_;  // drained while running (drain's alone)
  std::atomic<int64_t> errors_{0};
};

// Register a tap as the group's pre- and post-hook under `hook_id` (unregistered with
// the group's own `unregister_pre_hook` / `unregister_post_hook`).
std::shared_ptr<Tap> tap_group(
    c10d::ProcessGroup& group, int64_t hook_id, const std::vector<int64_t>& recorded, bool poll) {
  auto tap = std::make_shared<Tap>(recorded, poll);
  group.registerPreHook(hook_id, [tap](const c10d::PreHookArgs& args) { tap->pre(args); });
  group.registerPostHook(hook_id, [tap](const c10d::PostHookArgs& args) { tap->post(args); });
  return tap;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  py::class_<Tap, std::shared_ptr<Tap>>(module, "Tap")
      .def("drain", &Tap::drain, "(entered ops, ends of earlier ones, hook errors)")
      .def("end_blind", &Tap::end_blind, "End the ops without a future still waiting");
  module.def("tap_group", &tap_group, "Register C++ pre/post hooks on a process group");
  module.def("set_poll_period_us", &set_poll_period_us, "How often the poller asks its Works");
  module.def("settle_polling", &settle_polling, "Wait for the poller's next full pass");
  module.def("stop_polling", &stop_polling, "Stop the polling thread");
}
