// c4: end times of torch.distributed Works, taken in C++ without the GIL.
//
// Two ways, both writing the time into a fixed table of cells that the batching thread
// reads later (`ends_of`):
// - `stamp_on_end`: a callback on the Work's future, for backends whose future completes
//   when the operation has finished (gloo). A Python callback there runs on the backend's
//   thread before the waiting training thread is woken, and needs the GIL first: a GIL
//   round trip on every operation's critical path. This one needs neither.
// - `poll_on_end`: a thread that asks `Work::isCompleted()` every period, for backends whose
//   future completes at enqueue (NCCL: the query reads the CUDA events). A Python poller
//   takes the GIL a thousand times a second; this one never does, and sleeps while nothing
//   runs.
//
// Cells are a ring; a cell remembers which slot owns it, so a slot whose cell was taken
// over by a later operation reads as -1 (unknown) instead of as somebody else's end.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/utils/pybind.h>

namespace {

constexpr int64_t kCells = int64_t{1} << 16;

// owner and end change together under the cell's own tiny lock (never contended for
// longer than two stores), so an end is never credited to the cell's next owner.
struct Cell {
  std::atomic_flag busy = ATOMIC_FLAG_INIT;
  int64_t owner = -1;
  int64_t end_ns = 0;
};

class CellLock {
 public:
  explicit CellLock(Cell& cell) : cell_(cell) {
    while (cell_.busy.test_and_set(std::memory_order_acquire)) {
    }
  }
  ~CellLock() { cell_.busy.clear(std::memory_order_release); }
  CellLock(const CellLock&) = delete;
  CellLock& operator=(const CellLock&) = delete;

 private:
  Cell& cell_;
};

Cell cells[kCells];
std::atomic<int64_t> next_slot{0};

int64_t wall_clock_ns() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);  // the clock of Python's time.time_ns()
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

int64_t take_slot() {
  const int64_t slot = next_slot.fetch_add(1, std::memory_order_relaxed);
  Cell& cell = cells[slot & (kCells - 1)];
  CellLock lock(cell);
  cell.owner = slot;
  cell.end_ns = 0;
  return slot;
}

void write_end(int64_t slot, int64_t end_ns) {
  Cell& cell = cells[slot & (kCells - 1)];
  CellLock lock(cell);
  if (cell.owner == slot) {
    cell.end_ns = end_ns;
  }
}

// The slot the Work's end time will be written to, or -1 when the Work has no future.
int64_t stamp_on_end(c10d::Work& work) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work.getFuture();
  } catch (const std::exception&) {
    return -1;
  }
  if (!future) {
    return -1;
  }
  const int64_t slot = take_slot();
  future->addCallback(
      [slot](c10::ivalue::Future& /*done*/) { write_end(slot, wall_clock_ns()); },
      /*uses_future=*/false);
  return slot;
}

struct Watched {
  c10::intrusive_ptr<c10d::Work> work;
  int64_t slot;
};

// Never destroyed: the thread may still sleep in it while the process exits.
struct Poller {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<Watched> incoming;
  std::chrono::microseconds period{200};
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
        write_end(each.slot, now);
      } else {
        watched[kept++] = std::move(each);
      }
    }
    watched.erase(watched.begin() + static_cast<std::ptrdiff_t>(kept), watched.end());
    std::this_thread::sleep_for(period);
    lock.lock();
  }
}

// The slot the end time of the Work will be written to once the poller sees it completed.
int64_t poll_on_end(c10d::Work& work) {
  const int64_t slot = take_slot();
  Poller& state = poller();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.incoming.push_back({c10::intrusive_ptr<c10d::Work>::reclaim_copy(&work), slot});
  if (!state.started) {
    state.started = true;
    state.stopping = false;
    state.thread = std::thread(poll_loop, std::ref(state));
  }
  if (state.blocked) {
    state.wake.notify_one();
  }
  return slot;
}

void set_poll_period_us(int64_t period_us) {
  Poller& state = poller();
  std::lock_guard<std::mutex> lock(state.mutex);
  state.period = std::chrono::microseconds(period_us < 1 ? 1 : period_us);
}

// Stop the polling thread (at exit); Works it still watched are let go, their ends unknown.
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
    pybind11::gil_scoped_release released;  // the thread never takes the GIL, but be sure
    state.thread.join();
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  state.incoming.clear();
  state.started = false;
  state.stopping = false;
}

// Per slot: its end time, 0 while the Work runs, -1 when a later slot took the cell over.
std::vector<int64_t> ends_of(const std::vector<int64_t>& slots) {
  std::vector<int64_t> ends;
  ends.reserve(slots.size());
  for (const int64_t slot : slots) {
    Cell& cell = cells[slot & (kCells - 1)];
    CellLock lock(cell);
    ends.push_back(cell.owner == slot ? cell.end_ns : -1);
  }
  return ends;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.def("stamp_on_end", &stamp_on_end, "The slot the Work's end time goes to (-1: no future)");
  module.def("poll_on_end", &poll_on_end, "The slot the polled Work's end time goes to");
  module.def("set_poll_period_us", &set_poll_period_us, "How often the poller asks its Works");
  module.def("stop_polling", &stop_polling, "Stop the polling thread");
  module.def("ends_of", &ends_of, "End times of slots (0: running, -1: cell reused)");
}
