// The emulator's scheduler: CUDA threads as fibers, barriers and warp collectives as scheduling
// points, launches checked against sm_90, and the ops that choose the schedule (see runtime.h).

#include "runtime.h"

#include <torch/library.h>

#include <sys/mman.h>

#include <algorithm>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#endif

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

#ifndef EMU_NAMESPACE
#define EMU_NAMESPACE yoso_emu
#endif

namespace emu {

ThreadIndex* current = nullptr;

namespace {

// sm_90 (H100) limits, from the CUDA C++ Programming Guide's table of compute capabilities.
constexpr unsigned kMaxThreadsPerBlock = 1024;
constexpr unsigned kMaxBlockDim[3] = {1024, 1024, 64};
constexpr uint64_t kMaxGridDim[3] = {2147483647ull, 65535, 65535};
constexpr size_t kMaxSharedPerBlock = 48 * 1024;  // without a cudaFuncSetAttribute opt-in, which the kernels never make
constexpr int kWarp = 32;

#if defined(EMU_ASAN)
constexpr size_t kStackBytes = 512 * 1024;  // instrumented frames are larger
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif
constexpr size_t kGuardBytes = 4096;

// ---------------------------------------------------------------------------------------------
// Fibers: a stack and a saved stack pointer. On x86-64 a switch saves the callee-saved registers
// (not the floating-point control words, which no kernel changes); elsewhere ucontext.

#if defined(__x86_64__)
extern "C" void emu_switch_context(void** save_sp, void* load_sp);
extern "C" void emu_fiber_trampoline();
asm(R"(
  .text
  .globl emu_switch_context
  .hidden emu_switch_context
  .type emu_switch_context,@function
emu_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch_context,.-emu_switch_context

  .globl emu_fiber_trampoline
  .hidden emu_fiber_trampoline
  .type emu_fiber_trampoline,@function
emu_fiber_trampoline:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size emu_fiber_trampoline,.-emu_fiber_trampoline
)");

struct Context {
  void* sp = nullptr;
};

void init_context(Context& context, char* stack, size_t bytes, void (*entry)(void*), void* argument) {
  auto* top = reinterpret_cast<uint64_t*>(reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15));
  uint64_t* sp = top;
  *--sp = reinterpret_cast<uint64_t>(&emu_fiber_trampoline);  // `ret` lands here with sp 16-aligned
  *--sp = 0;                                                  // rbp
  *--sp = 0;                                                  // rbx
  *--sp = reinterpret_cast<uint64_t>(argument);               // r12
  *--sp = reinterpret_cast<uint64_t>(entry);                  // r13
  *--sp = 0;                                                  // r14
  *--sp = 0;                                                  // r15
  context.sp = sp;
}

inline void switch_context(Context& from, Context& to) { emu_switch_context(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
  void (*entry)(void*) = nullptr;
  void* argument = nullptr;
};

void start_context(unsigned high, unsigned low) {  // makecontext passes ints: the Context's address in two halves
  auto* context = reinterpret_cast<Context*>((uintptr_t(high) << 32) | low);
  context->entry(context->argument);
}

void init_context(Context& context, char* stack, size_t bytes, void (*entry)(void*), void* argument) {
  context.entry = entry;
  context.argument = argument;
  getcontext(&context.uc);
  context.uc.uc_stack.ss_sp = stack;
  context.uc.uc_stack.ss_size = bytes;
  context.uc.uc_link = nullptr;
  const auto address = reinterpret_cast<uintptr_t>(&context);
  makecontext(&context.uc, reinterpret_cast<void (*)()>(&start_context), 2, unsigned(address >> 32), unsigned(address & 0xffffffffu));
}

inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// A stack with a guard page below it, so an overflow faults instead of corrupting a neighbour.
struct Stack {
  char* base = nullptr;
  Stack() {
    void* memory = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    TORCH_CHECK(memory != MAP_FAILED, "CUDA emulator: could not map a fiber stack");
    mprotect(memory, kGuardBytes, PROT_NONE);
    base = static_cast<char*>(memory) + kGuardBytes;
  }
  ~Stack() { munmap(base - kGuardBytes, kStackBytes + kGuardBytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
};

// ---------------------------------------------------------------------------------------------
// Schedules

enum class Order { Forward, Reverse, Random };

struct Settings {
  Order order = Order::Forward;
  uint64_t seed = 0;
} settings;

struct Statistics {
  int64_t launches = 0, blocks = 0, threads = 0, switches = 0, barriers = 0, collectives = 0, sorts = 0, assertions = 0;
} statistics;

const char* collective_name(Collective kind) {
  switch (kind) {
    case Collective::Shfl: return "__shfl_sync";
    case Collective::ShflXor: return "__shfl_xor_sync";
    case Collective::ShflUp: return "__shfl_up_sync";
    case Collective::ShflDown: return "__shfl_down_sync";
    case Collective::Ballot: return "__ballot_sync";
    case Collective::Any: return "__any_sync";
    case Collective::All: return "__all_sync";
    case Collective::SyncWarp: return "__syncwarp";
    case Collective::MatchAny: return "__match_any_sync";
  }
  return "?";
}

std::string hex(unsigned mask) {
  std::ostringstream out;
  out << "0x" << std::hex << mask;
  return out.str();
}

// ---------------------------------------------------------------------------------------------
// One block in flight

enum class State { Runnable, AtBarrier, InCollective, Exited };

struct Thread {
  ThreadIndex index;
  Context context;
  State state = State::Runnable;
  int line = 0;         // where it waits (barrier or collective)
  uint64_t result = 0;  // its result of the collective it waited in
};

struct Pending {  // a warp collective some lanes of `mask` have reached
  Collective kind;
  unsigned mask, arrived = 0;
  int width, line;
  uint64_t values[kWarp] = {};
  int arguments[kWarp] = {};
};

class Block;
Block* running_block = nullptr;

class Block {
 public:
  Block(const LaunchConfig& config, dim3 block_idx, const std::function<void()>& body,
        std::vector<std::unique_ptr<Stack>>& stacks, std::mt19937_64& random)
      : config_(config), body_(body), random_(random) {
    const unsigned size = config.block.x * config.block.y * config.block.z;
    threads_.resize(size);
    while (stacks.size() < size) stacks.push_back(std::make_unique<Stack>());
    for (unsigned t = 0; t < size; ++t) {
      Thread& thread = threads_[t];
      thread.index.thread_idx = dim3(t % config.block.x, (t / config.block.x) % config.block.y, t / (config.block.x * config.block.y));
      thread.index.block_idx = block_idx;
      thread.index.block_dim = config.block;
      thread.index.grid_dim = config.grid;
#if defined(EMU_ASAN)
      ASAN_UNPOISON_MEMORY_REGION(stacks[t]->base, kStackBytes);  // frames of an abandoned fiber stay poisoned
#endif
      stack_of_.push_back(stacks[t]->base);
      init_context(thread.context, stacks[t]->base, kStackBytes, &Block::entry, this);
    }
    warps_.resize((size + kWarp - 1) / kWarp);
    if (config.shared_bytes > 0) {
      dynamic_.reset(new char[config.shared_bytes]);
      std::memset(dynamic_.get(), 0xFF, config.shared_bytes);
    }
  }

  // Runs every thread to its end; returns an error message, empty on success.
  std::string run() {
    const int size = static_cast<int>(threads_.size());
    std::vector<int> order(size);
    std::iota(order.begin(), order.end(), 0);
    if (settings.order == Order::Reverse) std::reverse(order.begin(), order.end());
    while (error_.empty() && exited_ < size) {
      if (settings.order == Order::Random) std::shuffle(order.begin(), order.end(), random_);
      bool progressed = false;
      for (int t : order) {
        if (!error_.empty()) break;
        if (threads_[t].state != State::Runnable) continue;
        resume(t);
        progressed = true;
      }
      if (!progressed && error_.empty()) error_ = "deadlock: " + waiting_summary();
    }
    return error_;
  }

  void syncthreads(int line) {
    Thread& thread = threads_[running_];
    ++statistics.barriers;
    if (exited_ > 0) {
      return fail("__syncthreads (line " + std::to_string(line) + ") reached by " + name(running_) + " after " +
                  std::to_string(exited_) + " thread(s) of the block exited (first: " + name(first_exited_) + ")");
    }
    if (at_barrier_ > 0 && barrier_line_ != line) {
      return fail("divergent __syncthreads: " + name(running_) + " at line " + std::to_string(line) + ", " +
                  std::to_string(at_barrier_) + " thread(s) at line " + std::to_string(barrier_line_));
    }
    for (const auto& pending : warps_[running_ / kWarp]) {
      if (pending.mask >> (running_ % kWarp) & 1u) {
        return fail(name(running_) + " reaches __syncthreads (line " + std::to_string(line) +
                    ") while lanes of its warp wait for it in " + collective_name(pending.kind) + " (line " +
                    std::to_string(pending.line) + ")");
      }
    }
    barrier_line_ = line;
    if (++at_barrier_ == static_cast<int>(threads_.size())) {
      at_barrier_ = 0;
      for (Thread& other : threads_) other.state = State::Runnable;
      return;  // the last to arrive goes on
    }
    thread.state = State::AtBarrier;
    thread.line = line;
    yield();
  }

  uint64_t collective(Collective kind, unsigned mask, uint64_t value, int argument, int width, int line) {
    ++statistics.collectives;
    const int warp = running_ / kWarp, lane = running_ % kWarp;
    const int warp_size = std::min<int>(kWarp, static_cast<int>(threads_.size()) - warp * kWarp);
    const auto where = [&] { return std::string(collective_name(kind)) + " (line " + std::to_string(line) + ")"; };
    if (!(mask >> lane & 1u)) {
      fail(name(running_) + " calls " + where() + " with mask " + hex(mask) + ", which does not name its own lane");
      return 0;
    }
    if (warp_size < kWarp && (mask >> warp_size) != 0u) {
      fail(name(running_) + " calls " + where() + " with mask " + hex(mask) + " naming lanes past the block's last thread");
      return 0;
    }
    if (width < 1 || width > kWarp || (width & (width - 1)) != 0) {
      fail(name(running_) + " calls " + where() + " with width " + std::to_string(width) + " (a power of two <= 32)");
      return 0;
    }
    auto& pending_list = warps_[warp];
    Pending* pending = nullptr;
    for (auto& candidate : pending_list) {
      if ((candidate.mask & mask) == 0u) continue;
      if (candidate.mask != mask || candidate.kind != kind || candidate.line != line || candidate.width != width) {
        fail("mismatched warp collectives in warp " + std::to_string(warp) + ": " + name(running_) + " calls " + where() +
             " with mask " + hex(mask) + " while lanes " + hex(candidate.arrived) + " wait in " +
             collective_name(candidate.kind) + " (line " + std::to_string(candidate.line) + ") with mask " + hex(candidate.mask));
        return 0;
      }
      pending = &candidate;
    }
    if (pending == nullptr) {
      // The first lane to arrive checks the others: from here on, a lane of the mask that exits or
      // reaches a barrier is caught there.
      for (int other = 0; other < kWarp; ++other) {
        if (!(mask >> other & 1u)) continue;
        const Thread& peer = threads_[warp * kWarp + other];
        if (peer.state == State::Exited) {
          fail(name(running_) + " calls " + where() + " with mask " + hex(mask) + " naming lane " + std::to_string(other) +
               ", which has exited");
          return 0;
        }
        if (peer.state == State::AtBarrier) {
          fail(name(running_) + " calls " + where() + " while lane " + std::to_string(other) +
               " of its mask waits at __syncthreads (line " + std::to_string(peer.line) + ")");
          return 0;
        }
      }
      pending_list.push_back(Pending{kind, mask, 0u, width, line});
      pending = &pending_list.back();
    }
    pending->values[lane] = value;
    pending->arguments[lane] = argument;
    pending->arrived |= 1u << lane;
    if (pending->arrived == mask) {
      const std::string problem = complete(*pending, warp);
      pending_list.erase(pending_list.begin() + (pending - pending_list.data()));
      if (!problem.empty()) {
        fail(problem);
        return 0;
      }
      return threads_[running_].result;  // the last to arrive goes on
    }
    Thread& thread = threads_[running_];
    thread.state = State::InCollective;
    thread.line = line;
    yield();
    return thread.result;
  }

  void* shared(int line, size_t bytes) {
    auto found = static_shared_.find(line);
    if (found != static_shared_.end()) return found->second.get();
    static_bytes_ += bytes;
    if (static_bytes_ + config_.shared_bytes > kMaxSharedPerBlock) {
      fail("the block uses " + std::to_string(static_bytes_) + " bytes of static and " + std::to_string(config_.shared_bytes) +
           " of dynamic shared memory, more than sm_90's " + std::to_string(kMaxSharedPerBlock) + " per block");
    }
    char* memory = new char[std::max<size_t>(bytes, 1)];
    std::memset(memory, 0xFF, bytes);
    static_shared_.emplace(line, std::unique_ptr<char[]>(memory));
    return memory;
  }

  void* dynamic() { return dynamic_.get(); }

  void assertion_failed(const std::string& message) { fail(message); }

 private:
  static void entry(void* argument) {
    auto* block = static_cast<Block*>(argument);
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &block->scheduler_stack_, &block->scheduler_stack_size_);
#endif
    block->body_();
    block->exit_running();
  }

  void exit_running() {
    Thread& thread = threads_[running_];
    if (exited_ == 0) first_exited_ = running_;
    ++exited_;
    thread.state = State::Exited;
    if (at_barrier_ > 0) {
      fail(name(running_) + " exited while " + std::to_string(at_barrier_) + " thread(s) wait at __syncthreads (line " +
           std::to_string(barrier_line_) + ")");
    }
    for (const auto& pending : warps_[running_ / kWarp]) {
      if (pending.mask >> (running_ % kWarp) & 1u) {
        fail(name(running_) + " exited while lanes " + hex(pending.arrived) + " wait for it in " + collective_name(pending.kind) +
             " (line " + std::to_string(pending.line) + ")");
      }
    }
    yield(/*exiting=*/true);
  }

  // Computes every lane's result of a collective whose lanes have all arrived; an error message if
  // a lane reads a lane outside the mask.
  std::string complete(const Pending& pending, int warp) {
    uint64_t vote = 0;
    bool all = true, any = false;
    for (int lane = 0; lane < kWarp; ++lane) {
      if (!(pending.mask >> lane & 1u)) continue;
      const bool predicate = pending.values[lane] != 0;
      vote |= uint64_t(predicate) << lane;
      all = all && predicate;
      any = any || predicate;
    }
    for (int lane = 0; lane < kWarp; ++lane) {
      if (!(pending.mask >> lane & 1u)) continue;
      Thread& thread = threads_[warp * kWarp + lane];
      const int segment = lane & ~(pending.width - 1);
      const int argument = pending.arguments[lane];
      int source = lane;
      switch (pending.kind) {
        case Collective::Shfl: source = segment + (argument & (pending.width - 1)); break;
        case Collective::ShflXor: source = lane ^ argument; break;
        case Collective::ShflUp: source = lane - argument; break;
        case Collective::ShflDown: source = lane + argument; break;
        default: break;
      }
      if (source < segment || source >= segment + pending.width) source = lane;  // outside its segment: own value
      switch (pending.kind) {
        case Collective::Ballot: thread.result = vote; break;
        case Collective::Any: thread.result = any; break;
        case Collective::All: thread.result = all; break;
        case Collective::SyncWarp: thread.result = 0; break;
        case Collective::MatchAny: {
          uint64_t same = 0;
          for (int peer = 0; peer < kWarp; ++peer) {
            if ((pending.mask >> peer & 1u) && pending.values[peer] == pending.values[lane]) same |= uint64_t(1) << peer;
          }
          thread.result = same;
          break;
        }
        default:
          if (source < 0 || source >= kWarp || !(pending.mask >> source & 1u)) {
            return name(warp * kWarp + lane) + " reads lane " + std::to_string(source) + " in " +
                   collective_name(pending.kind) + " (line " + std::to_string(pending.line) + "), outside the mask " +
                   hex(pending.mask);
          }
          thread.result = pending.values[source];
      }
      thread.state = State::Runnable;
    }
    return {};
  }

  void resume(int t) {
    running_ = t;
    current = &threads_[t].index;
    ++statistics.switches;
#if defined(EMU_ASAN)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(&fake_stack, stack_of_[t], kStackBytes);
#endif
    switch_context(scheduler_, threads_[t].context);
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(fake_stack, nullptr, nullptr);
#endif
    current = nullptr;
  }

  void yield(bool exiting = false) {
#if defined(EMU_ASAN)
    void* fake_stack = nullptr;
    __sanitizer_start_switch_fiber(exiting ? nullptr : &fake_stack, scheduler_stack_, scheduler_stack_size_);
#else
    (void)exiting;
#endif
    switch_context(threads_[running_].context, scheduler_);
#if defined(EMU_ASAN)
    __sanitizer_finish_switch_fiber(fake_stack, &scheduler_stack_, &scheduler_stack_size_);
#endif
  }

  void fail(const std::string& message) {
    if (error_.empty()) error_ = message;
    threads_[running_].state = State::InCollective;  // never resumed: the block is abandoned
    yield();
  }

  std::string name(int t) const {
    const ThreadIndex& index = threads_[t].index;
    std::ostringstream out;
    out << "thread (" << index.thread_idx.x << "," << index.thread_idx.y << "," << index.thread_idx.z << ") [warp " << t / kWarp
        << " lane " << t % kWarp << "]";
    return out.str();
  }

  std::string waiting_summary() const {
    std::ostringstream out;
    if (at_barrier_ > 0) out << at_barrier_ << " thread(s) wait at __syncthreads (line " << barrier_line_ << "); ";
    for (size_t warp = 0; warp < warps_.size(); ++warp) {
      for (const auto& pending : warps_[warp]) {
        out << "warp " << warp << " lanes " << hex(pending.arrived) << " wait in " << collective_name(pending.kind) << " (line "
            << pending.line << ") for lanes " << hex(pending.mask & ~pending.arrived) << "; ";
      }
    }
    out << exited_ << " thread(s) exited";
    return out.str();
  }

  const LaunchConfig& config_;
  const std::function<void()>& body_;
  std::mt19937_64& random_;
  std::vector<Thread> threads_;
  std::vector<char*> stack_of_;
  std::vector<std::vector<Pending>> warps_;
  std::map<int, std::unique_ptr<char[]>> static_shared_;
  std::unique_ptr<char[]> dynamic_;
  size_t static_bytes_ = 0;
  Context scheduler_;
  const void* scheduler_stack_ = nullptr;
  size_t scheduler_stack_size_ = 0;
  int running_ = -1, exited_ = 0, first_exited_ = -1, at_barrier_ = 0, barrier_line_ = -1;
  std::string error_;
};

std::vector<std::unique_ptr<Stack>>& stack_pool() {
  static std::vector<std::unique_ptr<Stack>> stacks;
  return stacks;
}

std::string dims(dim3 d) {
  return "(" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) + ")";
}

}  // namespace

void syncthreads(int line) {
  TORCH_CHECK(running_block != nullptr, "CUDA emulator: __syncthreads outside a kernel");
  running_block->syncthreads(line);
}

uint64_t warp_collective(Collective kind, unsigned mask, uint64_t value, int lane_arg, int width, int line) {
  TORCH_CHECK(running_block != nullptr, "CUDA emulator: a warp collective outside a kernel");
  return running_block->collective(kind, mask, value, lane_arg, width, line);
}

void* block_shared(int line, size_t bytes) { return running_block->shared(line, bytes); }

void* dynamic_shared() { return running_block->dynamic(); }

void count_assertion() { ++statistics.assertions; }

void device_assert_failed(const char* condition, const char* message, int line) {
  const std::string what = std::string("device-side assertion `") + condition + "` failed (line " + std::to_string(line) +
                           "): " + message;
  TORCH_CHECK(running_block != nullptr, "CUDA emulator: ", what, " (outside a kernel)");
  running_block->assertion_failed(what);
}

void count_sort() { ++statistics.sorts; }

bool sort_flips_buffers() {
  switch (settings.order) {
    case Order::Forward: return true;
    case Order::Reverse: return false;
    case Order::Random: return std::mt19937_64(settings.seed + statistics.launches)() & 1u;
  }
  return true;
}

void run_grid(const LaunchConfig& config, const char* kernel, int launch_bound, const std::function<void()>& body) {
  const std::string launch = std::string("CUDA emulator: launch of ") + kernel + "<<<" + dims(config.grid) + ", " +
                             dims(config.block) + ", " + std::to_string(config.shared_bytes) + ">>>: ";
  const unsigned block_dims[3] = {config.block.x, config.block.y, config.block.z};
  const uint64_t grid_dims[3] = {config.grid.x, config.grid.y, config.grid.z};
  for (int axis = 0; axis < 3; ++axis) {
    TORCH_CHECK(block_dims[axis] >= 1 && block_dims[axis] <= kMaxBlockDim[axis], launch, "block dimension ", axis, " = ",
                block_dims[axis], " outside sm_90's [1, ", kMaxBlockDim[axis], "]");
    TORCH_CHECK(grid_dims[axis] >= 1 && grid_dims[axis] <= kMaxGridDim[axis], launch, "grid dimension ", axis, " = ",
                grid_dims[axis], " outside sm_90's [1, ", kMaxGridDim[axis], "] (an empty grid is an invalid configuration)");
  }
  const uint64_t threads = uint64_t(config.block.x) * config.block.y * config.block.z;
  TORCH_CHECK(threads <= kMaxThreadsPerBlock, launch, threads, " threads per block, more than sm_90's ", kMaxThreadsPerBlock);
  TORCH_CHECK(threads <= static_cast<uint64_t>(launch_bound), launch, threads, " threads per block, more than the kernel's __launch_bounds__(",
              launch_bound, ")");
  TORCH_CHECK(config.shared_bytes <= kMaxSharedPerBlock, launch, config.shared_bytes,
              " bytes of dynamic shared memory, more than sm_90's ", kMaxSharedPerBlock, " without an opt-in");
  TORCH_CHECK(running_block == nullptr, launch, "a launch from inside a kernel (dynamic parallelism) is not emulated");

  ++statistics.launches;
  const uint64_t blocks = grid_dims[0] * grid_dims[1] * grid_dims[2];
  std::vector<uint64_t> order(blocks);
  std::iota(order.begin(), order.end(), uint64_t(0));
  std::mt19937_64 random(settings.seed * 0x9E3779B97F4A7C15ull + statistics.launches);
  if (settings.order == Order::Reverse) std::reverse(order.begin(), order.end());
  if (settings.order == Order::Random) std::shuffle(order.begin(), order.end(), random);
  for (const uint64_t linear : order) {
    const dim3 block_idx(static_cast<unsigned>(linear % grid_dims[0]), static_cast<unsigned>((linear / grid_dims[0]) % grid_dims[1]),
                         static_cast<unsigned>(linear / (grid_dims[0] * grid_dims[1])));
    Block block(config, block_idx, body, stack_pool(), random);
    running_block = &block;
    const std::string error = block.run();
    running_block = nullptr;
    ++statistics.blocks;
    statistics.threads += static_cast<int64_t>(threads);
    TORCH_CHECK(error.empty(), launch, "block ", dims(block_idx), ": ", error);
  }
}

namespace {

void configure(c10::string_view order, int64_t seed) {
  const std::string name(order);
  if (name == "forward") {
    settings.order = Order::Forward;
  } else if (name == "reverse") {
    settings.order = Order::Reverse;
  } else if (name == "random") {
    settings.order = Order::Random;
  } else {
    TORCH_CHECK(false, "CUDA emulator: unknown schedule '", name, "' (forward, reverse or random)");
  }
  settings.seed = static_cast<uint64_t>(seed);
}

std::vector<int64_t> read_statistics() {
  return {statistics.launches, statistics.blocks,      statistics.threads, statistics.switches,
          statistics.barriers, statistics.collectives, statistics.sorts,   statistics.assertions};
}

}  // namespace

}  // namespace emu

TORCH_LIBRARY_FRAGMENT(EMU_NAMESPACE, m) {
  m.def("emulator_schedule(str order, int seed) -> ()", &emu::configure);
  m.def("emulator_statistics() -> int[]", &emu::read_statistics);
}
