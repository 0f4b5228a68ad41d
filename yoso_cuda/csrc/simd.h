// SIMD building blocks shared by the CPU kernels (yoso.cpp, softmax_dropout.cpp, sequence_conv.cpp, dropout.cpp,
// expectation.cpp, chunked_attention.cpp): GNU vector extensions (GCC or Clang), compiled for AVX2 with FMA (x86-64-v3)
// and for the baseline where GCC can multiversion.

#pragma once

#include <cstdint>
#include <cstring>

namespace yoso {
namespace {

// x86-64-v3 (AVX2, FMA, ...; every x86 CPU since 2013-2015) lets a * b + c be one fused multiply-add:
// without FMA the block GEMMs of softmax_dropout.cpp ran a multiply and an add per product and
// spilled their accumulators to the stack. GCC before 11 has no ISA levels, and "arch=haswell" would
// select by CPU model, not by feature: there, AVX2 alone.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && __GNUC__ >= 11
#define YOSO_MULTIVERSIONED __attribute__((target_clones("arch=x86-64-v3", "default")))
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define YOSO_MULTIVERSIONED __attribute__((target_clones("avx2", "default")))
#else
#define YOSO_MULTIVERSIONED
#endif
// Helpers are forced inline so that they are compiled for the ISA of the multiversioned caller.
#define YOSO_INLINE inline __attribute__((always_inline))

// Passing 32-byte vectors by value has a different ABI with and without AVX; every function that
// does is forced inline into one multiversioned caller, so no call crosses the two.
#pragma GCC diagnostic ignored "-Wpsabi"

constexpr int64_t kLanes = 8;  // floats per SIMD value
typedef float Floats __attribute__((vector_size(32)));
typedef int32_t Ints __attribute__((vector_size(32)));

YOSO_INLINE Floats load(const float* p) {
  Floats value;
  std::memcpy(&value, p, sizeof value);
  return value;
}

YOSO_INLINE void store(float* p, Floats value) { std::memcpy(p, &value, sizeof value); }

typedef float HalfFloats __attribute__((vector_size(16)));

YOSO_INLINE float horizontal_sum(Floats value) {
  HalfFloats low, high;  // the two 128-bit halves
  std::memcpy(&low, &value, sizeof low);
  std::memcpy(&high, reinterpret_cast<const char*>(&value) + sizeof low, sizeof high);
  low += high;
  return (low[0] + low[2]) + (low[1] + low[3]);
}

YOSO_INLINE float dot(const float* a, const float* b, int64_t size) {
  Floats even{}, odd{};  // two chains of partial sums, so consecutive multiply-adds overlap
  int64_t k = 0;
  for (; k + 2 * kLanes <= size; k += 2 * kLanes) {
    even += load(a + k) * load(b + k);
    odd += load(a + k + kLanes) * load(b + k + kLanes);
  }
  if (k + kLanes <= size) {
    even += load(a + k) * load(b + k);
    k += kLanes;
  }
  float total = horizontal_sum(even + odd);
  for (; k < size; ++k) total += a[k] * b[k];
  return total;
}

YOSO_INLINE void add(float* out, const float* x, int64_t size) {
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, load(out + k) + load(x + k));
  for (; k < size; ++k) out[k] += x[k];
}

YOSO_INLINE void axpy(float* out, float factor, const float* x, int64_t size) {  // out += factor * x
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, load(out + k) + factor * load(x + k));
  for (; k < size; ++k) out[k] += factor * x[k];
}

YOSO_INLINE void scale(float* out, float factor, int64_t size) {
  int64_t k = 0;
  for (; k + kLanes <= size; k += kLanes) store(out + k, load(out + k) * factor);
  for (; k < size; ++k) out[k] *= factor;
}

// exp(x) for x <= 0 (scores minus their row's max), by the Cephes polynomial: within 2 ulp of expf over [-87, 0];
// 0 below -87, where expf is under 1.7e-38 (and for -inf, a masked key).
YOSO_INLINE Floats exp_nonpositive(Floats x) {
  const Ints below = x < -87.0f;
  x = below ? Floats{} - 87.0f : x;
  const Floats n = x * 1.44269504088896341f + 0.5f;
  Floats whole = __builtin_convertvector(__builtin_convertvector(n, Ints), Floats);  // truncated: floor for n <= 0.5
  whole = whole > n ? whole - 1.0f : whole;
  const Floats r = x - whole * 0.693359375f + whole * 2.12194440e-4f;
  Floats poly = 1.9875691500e-4f * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  poly = poly * r * r + r + 1.0f;
  const Ints exponent = (__builtin_convertvector(whole, Ints) + 127) << 23;
  const Floats value = poly * reinterpret_cast<Floats>(exponent);
  return reinterpret_cast<Floats>(reinterpret_cast<Ints>(value) & ~below);
}

// The same for one float, through the same arithmetic (tails of rows not a multiple of 8 long).
YOSO_INLINE float exp_nonpositive(float x) { return exp_nonpositive(Floats{} + x)[0]; }

}  // namespace
}  // namespace yoso
