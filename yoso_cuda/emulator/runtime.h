// A CUDA execution model on the CPU, for running yoso_cuda's real .cu kernels where no GPU exists.
//
// The kernel source is compiled as C++ after the mechanical rewrite of rewrite.py (launch syntax,
// __shared__ declarations, CUDA-only includes and the dispatch key); everything else it uses from
// CUDA is defined here. Every thread of a block runs as a fiber on one OS thread; __syncthreads and
// the warp collectives are the only scheduling points, and a collective completes only when every
// lane of its mask has arrived. The scheduler runs blocks and threads in a chosen order (forward,
// reverse, seeded random), so a kernel whose result depends on the order (a race between two
// threads, a read of memory no thread wrote) gives different bits under different schedules.
// Launches are checked against sm_90's limits; shared memory and at::empty outputs start as 0xFF
// bytes; cub::DeviceRadixSort is a stable sort that rejects keys with bits at or above end_bit.
//
// What it cannot model: the weak memory model (it is sequentially consistent), CUB's real code,
// FMA contraction and the GPU's rounding of transcendental functions, registers, timing.

#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------------------------
// Language: qualifiers, built-in variables and types

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

struct emu_stream;
using cudaStream_t = emu_stream*;
enum cudaError_t { cudaSuccess = 0, cudaErrorInvalidValue = 1 };

namespace emu {

// What a running CUDA thread sees. The scheduler points `current` at the running fiber's.
struct ThreadIndex {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
};
extern ThreadIndex* current;

}  // namespace emu

#define threadIdx (::emu::current->thread_idx)
#define blockIdx (::emu::current->block_idx)
#define blockDim (::emu::current->block_dim)
#define gridDim (::emu::current->grid_dim)
constexpr int warpSize = 32;

// ---------------------------------------------------------------------------------------------
// Scheduling points: the barrier and the warp collectives (call sites carry their line)

namespace emu {

enum class Collective { Shfl, ShflXor, ShflUp, ShflDown, Ballot, Any, All, SyncWarp, MatchAny };

void syncthreads(int line);
uint64_t warp_collective(Collective kind, unsigned mask, uint64_t value, int lane_arg, int width, int line);

template <typename T>
T shuffle(Collective kind, unsigned mask, T value, int lane_arg, int width, int line) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= sizeof(uint64_t), "shuffle of an 8-byte value at most");
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  bits = warp_collective(kind, mask, bits, lane_arg, width, line);
  T result;
  std::memcpy(&result, &bits, sizeof(T));
  return result;
}

}  // namespace emu

#define __syncthreads() ::emu::syncthreads(__LINE__)
#define __syncwarp(...) ::emu::syncwarp_at(__LINE__, ::emu::mask_or_full(__VA_ARGS__))
#define __shfl_sync(mask, value, lane, ...) \
  ::emu::shuffle(::emu::Collective::Shfl, (mask), (value), (lane), ::emu::width_or_warp(__VA_ARGS__), __LINE__)
#define __shfl_xor_sync(mask, value, lane_mask, ...) \
  ::emu::shuffle(::emu::Collective::ShflXor, (mask), (value), (lane_mask), ::emu::width_or_warp(__VA_ARGS__), __LINE__)
#define __shfl_up_sync(mask, value, delta, ...) \
  ::emu::shuffle(::emu::Collective::ShflUp, (mask), (value), static_cast<int>(delta), ::emu::width_or_warp(__VA_ARGS__), __LINE__)
#define __shfl_down_sync(mask, value, delta, ...) \
  ::emu::shuffle(::emu::Collective::ShflDown, (mask), (value), static_cast<int>(delta), ::emu::width_or_warp(__VA_ARGS__), __LINE__)
#define __ballot_sync(mask, predicate) \
  static_cast<unsigned>(::emu::warp_collective(::emu::Collective::Ballot, (mask), (predicate) ? 1u : 0u, 0, 32, __LINE__))
#define __any_sync(mask, predicate) \
  static_cast<int>(::emu::warp_collective(::emu::Collective::Any, (mask), (predicate) ? 1u : 0u, 0, 32, __LINE__))
#define __all_sync(mask, predicate) \
  static_cast<int>(::emu::warp_collective(::emu::Collective::All, (mask), (predicate) ? 1u : 0u, 0, 32, __LINE__))
// The lanes of `mask` holding the same value as this lane (sm_70+); values of up to 8 bytes.
#define __match_any_sync(mask, value) \
  static_cast<unsigned>(::emu::warp_collective(::emu::Collective::MatchAny, (mask), ::emu::match_bits(value), 0, 32, __LINE__))

namespace emu {
template <typename T>
uint64_t match_bits(T value) {
  static_assert(std::is_integral<T>::value && sizeof(T) <= sizeof(uint64_t), "__match_any_sync takes an integer");
  return static_cast<uint64_t>(value);
}
constexpr unsigned mask_or_full() { return 0xffffffffu; }  // __syncwarp() without a mask
constexpr unsigned mask_or_full(unsigned mask) { return mask; }
constexpr int width_or_warp() { return 32; }
constexpr int width_or_warp(int width) { return width; }
inline void syncwarp_at(int line, unsigned mask) { warp_collective(Collective::SyncWarp, mask, 0, 0, 32, line); }
}  // namespace emu

// ---------------------------------------------------------------------------------------------
// Intrinsics (round-to-nearest float ops are the host's: x86-64 without -mfma never contracts)

inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }

// ---------------------------------------------------------------------------------------------
// Device-side assertions: c10's CUDA_KERNEL_ASSERT_MSG aborts the kernel on a GPU (the error surfaces
// at the next synchronisation, and the context is lost); here the failing thread ends its block and
// the launch throws, naming the condition, the message and the line.

namespace emu {
void device_assert_failed(const char* condition, const char* message, int line);
void count_assertion();
}  // namespace emu

#undef CUDA_KERNEL_ASSERT_MSG
#define CUDA_KERNEL_ASSERT_MSG(condition, message)                                  \
  do {                                                                              \
    ::emu::count_assertion();                                                       \
    if (!(condition)) ::emu::device_assert_failed(#condition, (message), __LINE__); \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Memory: shared memory per block, and poisoned fresh tensors

namespace emu {

// The block's array declared at `line` (the same storage for every thread of the block), 0xFF-filled.
void* block_shared(int line, size_t bytes);
// The block's dynamic shared memory (`extern __shared__`), 0xFF-filled, of the launch's size.
void* dynamic_shared();

// at::empty with every byte 0xFF, so a read of an element no kernel wrote shows (NaN, -1).
inline at::Tensor poisoned_empty(at::IntArrayRef size, at::TensorOptions options = {}) {
  at::Tensor tensor = at::empty(size, options);
  if (tensor.numel() > 0) std::memset(tensor.data_ptr(), 0xFF, tensor.nbytes());
  return tensor;
}

// ---------------------------------------------------------------------------------------------
// Launches

struct LaunchConfig {
  dim3 grid, block;
  size_t shared_bytes;
  LaunchConfig(dim3 grid_, dim3 block_, size_t shared_bytes_ = 0, cudaStream_t = nullptr)
      : grid(grid_), block(block_), shared_bytes(shared_bytes_) {}
};

// Runs `body` once per thread of the grid under the current schedule; throws a c10::Error naming
// the kernel, block and thread for an invalid launch, a divergent or mismatched collective or
// barrier, or a deadlock. `launch_bound` is the kernel's __launch_bounds__ (1024 if it has none).
void run_grid(const LaunchConfig& config, const char* kernel, int launch_bound, const std::function<void()>& body);

template <typename... Params, typename... Args>
void launch(const LaunchConfig& config, const char* name, int launch_bound, void (*kernel)(Params...), Args&&... args) {
  // Arguments are converted to the parameter types at the launch, as CUDA does, and each thread gets
  // its own copies.
  const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  run_grid(config, name, launch_bound, [&] { std::apply(kernel, params); });
}

}  // namespace emu

// ---------------------------------------------------------------------------------------------
// The CUDA runtime and c10/ATen CUDA helpers the kernels' host code uses

namespace c10 {
namespace cuda {
struct OptionalCUDAGuard {
  explicit OptionalCUDAGuard(const c10::Device&) {}
};
}  // namespace cuda
}  // namespace c10

namespace at {
namespace cuda {
inline cudaStream_t getCurrentCUDAStream(c10::DeviceIndex = -1) { return nullptr; }
}  // namespace cuda
}  // namespace at

#define C10_CUDA_CHECK(expression)                                                           \
  do {                                                                                       \
    const cudaError_t emu_status = (expression);                                             \
    TORCH_CHECK(emu_status == cudaSuccess, "CUDA emulator: ", #expression, " failed");       \
  } while (0)
#define C10_CUDA_KERNEL_LAUNCH_CHECK() \
  do {                                 \
  } while (0)  // emu::launch throws at the launch itself

// ---------------------------------------------------------------------------------------------
// CUB's device radix sort: a stable sort on bits [begin_bit, end_bit) of the keys

namespace emu {
// Whether the sort leaves the result in the alternate buffers (the real CUB may end in either, so
// code must read Current()); the schedule decides.
bool sort_flips_buffers();
void count_sort();  // a radix sort (several kernel launches on a GPU), for the statistics
}  // namespace emu

namespace cub {

template <typename T>
struct DoubleBuffer {
  T* d_buffers[2];
  int selector = 0;
  DoubleBuffer(T* current, T* alternate) : d_buffers{current, alternate} {}
  T* Current() const { return d_buffers[selector]; }
  T* Alternate() const { return d_buffers[selector ^ 1]; }
};

struct DeviceRadixSort {
  template <typename Key, typename Value, typename Count>
  static cudaError_t SortPairs(void* temp_storage, size_t& temp_bytes, DoubleBuffer<Key>& keys, DoubleBuffer<Value>& values,
                               Count num_items, int begin_bit = 0, int end_bit = sizeof(Key) * 8,
                               cudaStream_t = nullptr) {
    static_assert(std::is_unsigned<Key>::value, "the emulated radix sort takes unsigned keys");
    const int64_t count = static_cast<int64_t>(num_items);
    if (temp_storage == nullptr) {
      temp_bytes = static_cast<size_t>(count) * sizeof(int64_t) + 1;
      return cudaSuccess;
    }
    constexpr int key_bits = sizeof(Key) * 8;
    TORCH_CHECK(0 <= begin_bit && begin_bit < end_bit && end_bit <= key_bits,
                "CUDA emulator: cub::DeviceRadixSort::SortPairs: invalid bit range [", begin_bit, ", ", end_bit, ")");
    emu::count_sort();
    const Key* in_keys = keys.Current();
    const Value* in_values = values.Current();
    if (end_bit < key_bits) {
      for (int64_t i = 0; i < count; ++i) {
        TORCH_CHECK((in_keys[i] >> end_bit) == 0, "CUDA emulator: cub::DeviceRadixSort::SortPairs: key ", i, " = ",
                    static_cast<uint64_t>(in_keys[i]), " has bits at or above end_bit = ", end_bit,
                    ", which the radix sort ignores (end_bit too small)");
      }
    }
    const Key digit_mask = end_bit - begin_bit == key_bits ? ~Key(0) : ((Key(1) << (end_bit - begin_bit)) - 1);
    std::vector<int64_t> order(count);
    for (int64_t i = 0; i < count; ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      return ((in_keys[a] >> begin_bit) & digit_mask) < ((in_keys[b] >> begin_bit) & digit_mask);
    });
    std::vector<Key> sorted_keys(count);
    std::vector<Value> sorted_values(count);
    for (int64_t i = 0; i < count; ++i) {
      sorted_keys[i] = in_keys[order[i]];
      sorted_values[i] = in_values[order[i]];
    }
    if (emu::sort_flips_buffers()) {
      keys.selector ^= 1;
      values.selector ^= 1;
    }
    std::copy(sorted_keys.begin(), sorted_keys.end(), keys.Current());
    std::copy(sorted_values.begin(), sorted_values.end(), values.Current());
    return cudaSuccess;
  }
};

}  // namespace cub
