// Kernels that break CUDA's rules, one per fault the emulator must report (test_emulator_faults.py).
// Each op takes a float tensor of kThreads elements and returns what its kernel wrote.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cub/device/device_radix_sort.cuh>

namespace {

constexpr int kThreads = 64;

__global__ void __launch_bounds__(kThreads) divergent_barrier_kernel(float* out) {
  if (threadIdx.x < 32) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(kThreads) barrier_after_exit_kernel(float* out) {
  if (threadIdx.x == 5) {
    return;
  }
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void __launch_bounds__(kThreads) mismatched_shuffles_kernel(float* out) {
  float value = static_cast<float>(threadIdx.x);
  if (threadIdx.x % 2 == 0) {
    value = __shfl_sync(0xffffffffu, value, 0);
  } else {
    value = __shfl_xor_sync(0xffffffffu, value, 1);
  }
  out[threadIdx.x] = value;
}

__global__ void __launch_bounds__(kThreads) shuffle_with_exited_lane_kernel(float* out) {
  if (threadIdx.x == 3) {
    return;
  }
  out[threadIdx.x] = __shfl_sync(0xffffffffu, 1.0f, 0);
}

__global__ void __launch_bounds__(kThreads) shuffle_outside_mask_kernel(float* out) {
  if (threadIdx.x < 16) {
    out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1.0f, 20);  // lane 20 is not in the mask
  }
}

__global__ void __launch_bounds__(kThreads) mask_without_own_lane_kernel(float* out) {
  out[threadIdx.x] = static_cast<float>(__ballot_sync(0x1u, true));
}

// Each thread reads its neighbour's slot of shared memory without a barrier: the value read
// depends on which thread ran first (or is the 0xFF fill if none wrote it yet).
__global__ void __launch_bounds__(kThreads) shared_memory_race_kernel(const float* in, float* out) {
  __shared__ float slots[kThreads];
  slots[threadIdx.x] = in[threadIdx.x];
  out[threadIdx.x] = slots[(threadIdx.x + 1) % kThreads];
}

__global__ void __launch_bounds__(kThreads) copy_kernel(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x]; }

__global__ void __launch_bounds__(kThreads) large_static_shared_kernel(float* out) {
  __shared__ float big[16384];  // 64 KiB: past the 48 KiB a block gets without an opt-in
  big[threadIdx.x] = 1.0f;
  out[threadIdx.x] = big[threadIdx.x];
}

__global__ void unbounded_copy_kernel(const float* in, float* out) { out[0] = in[0]; }

at::Tensor launch(const at::Tensor& x, int64_t which) {
  at::Tensor out = at::zeros_like(x);
  float* o = out.data_ptr<float>();
  const float* in = x.data_ptr<float>();
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  switch (which) {
    case 0: divergent_barrier_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 1: barrier_after_exit_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 2: mismatched_shuffles_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 3: shuffle_with_exited_lane_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 4: shuffle_outside_mask_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 5: mask_without_own_lane_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 6: shared_memory_race_kernel<<<1, kThreads, 0, stream>>>(in, o); break;
    case 7: copy_kernel<<<1, 2 * kThreads, 0, stream>>>(in, o); break;  // past its __launch_bounds__
    case 8: unbounded_copy_kernel<<<1, dim3(64, 32), 0, stream>>>(in, o); break;  // 2048 threads: past sm_90's 1024
    case 9: copy_kernel<<<0, kThreads, 0, stream>>>(in, o); break;  // an empty grid
    case 10: copy_kernel<<<dim3(1, 70000), kThreads, 0, stream>>>(in, o); break;  // grid y past 65535
    case 11: copy_kernel<<<1, kThreads, 64 * 1024, stream>>>(in, o); break;  // dynamic shared past 48 KiB
    case 12: large_static_shared_kernel<<<1, kThreads, 0, stream>>>(o); break;
    case 13: {  // a radix sort told to look at fewer bits than the keys have
      at::Tensor keys = at::arange(kThreads, x.options().dtype(at::kLong)).flip(0);
      at::Tensor keys_out = at::empty_like(keys), values = at::arange(kThreads, keys.options()), values_out = at::empty_like(values);
      cub::DoubleBuffer<unsigned long long> key_buffers(reinterpret_cast<unsigned long long*>(keys.data_ptr<int64_t>()),
                                                        reinterpret_cast<unsigned long long*>(keys_out.data_ptr<int64_t>()));
      cub::DoubleBuffer<int64_t> value_buffers(values.data_ptr<int64_t>(), values_out.data_ptr<int64_t>());
      size_t bytes = 0;
      cub::DeviceRadixSort::SortPairs(nullptr, bytes, key_buffers, value_buffers, kThreads, 0, 4, stream);
      at::Tensor temp = at::empty({static_cast<int64_t>(bytes)}, x.options().dtype(at::kByte));
      cub::DeviceRadixSort::SortPairs(temp.data_ptr(), bytes, key_buffers, value_buffers, kThreads, 0, 4, stream);
      break;
    }
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(yoso, CUDA, m) {
  m.impl("fault", &launch);
}
