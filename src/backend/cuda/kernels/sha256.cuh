// Per-token SHA-256 digests on the device (the token digest of model/digest.h): the SHA-256 of a
// token's hidden vector as little-endian float32 bytes. A trace that keeps stage hashes then
// copies 32 bytes per token to the host instead of 4*H.
//
// One thread per token (row): SHA-256 is a serial chain over 64-byte blocks, so the parallelism
// is across tokens. A block holds 16 float32 values; SHA-256 reads its message as big-endian
// 32-bit words, so the word of a value whose float32 bits are u (stored little-endian) is
// byteswap(u). A bf16 value h widens exactly to u = h << 16, whose word is byteswap16(h): the
// bytes hashed are those of the f32 tensor the host path would build, never a rounding of them.
// Padding (FIPS 180-4): 0x80 after the message (the message is whole words, so it starts the
// next word), zeros, the 64-bit big-endian bit length 32*dim in the last two words.
#pragma once

#include <cstdint>

#include "pdl.cuh"

namespace atlas::cuda::kern {

__constant__ uint32_t kSha256K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

__device__ __forceinline__ uint32_t rotr32(uint32_t x, int n) { return __funnelshift_r(x, x, n); }
__device__ __forceinline__ uint32_t bswap32(uint32_t x) { return __byte_perm(x, 0, 0x0123); }

// One 64-byte block into the state. w: the block's 16 big-endian words, used as the ring of the
// message schedule (overwritten). Fully unrolled so w stays in registers.
__device__ __forceinline__ void sha256_block(uint32_t st[8], uint32_t w[16]) {
  uint32_t a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], f = st[5], g = st[6], h = st[7];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    if (i >= 16) {  // W[i] = s1(W[i-2]) + W[i-7] + s0(W[i-15]) + W[i-16], in a ring of 16
      const uint32_t w15 = w[(i + 1) & 15], w2 = w[(i + 14) & 15];
      const uint32_t s0 = rotr32(w15, 7) ^ rotr32(w15, 18) ^ (w15 >> 3);
      const uint32_t s1 = rotr32(w2, 17) ^ rotr32(w2, 19) ^ (w2 >> 10);
      w[i & 15] += s0 + w[(i + 9) & 15] + s1;
    }
    const uint32_t S1 = rotr32(e, 6) ^ rotr32(e, 11) ^ rotr32(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + S1 + ch + kSha256K[i] + w[i & 15];
    const uint32_t S0 = rotr32(a, 2) ^ rotr32(a, 13) ^ rotr32(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + S0 + maj;
  }
  st[0] += a;
  st[1] += b;
  st[2] += c;
  st[3] += d;
  st[4] += e;
  st[5] += f;
  st[6] += g;
  st[7] += h;
}

// The big-endian message word of one stored value.
__device__ __forceinline__ uint32_t sha_word(uint16_t bf16) { return bswap32(uint32_t(bf16) << 16); }
__device__ __forceinline__ uint32_t sha_word(float f) { return bswap32(__float_as_uint(f)); }

// The 16 words of full block `blk` of a row. vec: the row is 16-byte aligned (one or two
// 16-byte loads per 8 or 4 values instead of 16 scalar loads: every thread reads its own row,
// so scalar loads would cost one L1 wavefront per value).
__device__ __forceinline__ void load_block(const uint16_t* row, int64_t blk, bool vec, uint32_t w[16]) {
  const uint16_t* p = row + blk * 16;
  if (vec) {
    const uint4 q0 = reinterpret_cast<const uint4*>(p)[0], q1 = reinterpret_cast<const uint4*>(p)[1];
    const uint32_t u[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) {  // u[j] holds values 2j (low half) and 2j+1 (high half)
      w[2 * j] = sha_word(uint16_t(u[j] & 0xffffu));
      w[2 * j + 1] = sha_word(uint16_t(u[j] >> 16));
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) w[j] = sha_word(p[j]);
  }
}

__device__ __forceinline__ void load_block(const float* row, int64_t blk, bool vec, uint32_t w[16]) {
  const float* p = row + blk * 16;
  if (vec) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = reinterpret_cast<const float4*>(p)[q];
      w[4 * q] = sha_word(v.x);
      w[4 * q + 1] = sha_word(v.y);
      w[4 * q + 2] = sha_word(v.z);
      w[4 * q + 3] = sha_word(v.w);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 16; ++j) w[j] = sha_word(p[j]);
  }
}

// out[r*32 ..] = SHA-256 of row r (dim values of T, row stride `stride` elements), r < rows.
// vec: x and the stride allow 16-byte loads of every full block (checked by the launcher).
template <class T>
__global__ void token_digest_kernel(const T* __restrict__ x, int64_t stride, int64_t rows, int dim, bool vec,
                                    uint8_t* __restrict__ out) {
  pdl_begin();
  const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  const T* row = x + r * stride;
  uint32_t st[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                    0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
  uint32_t w[16];
  const int64_t full = dim / 16;
  for (int64_t blk = 0; blk < full; ++blk) {
    load_block(row, blk, vec, w);
    sha256_block(st, w);
  }
  // The tail: rem < 16 values, the 0x80 word, zeros, and (if it fits) the bit length.
  const int rem = dim - int(full * 16);
  const T* tail = row + full * 16;
  const uint64_t bits = uint64_t(dim) * 32u;
#pragma unroll
  for (int j = 0; j < 16; ++j) w[j] = j < rem ? sha_word(tail[j]) : (j == rem ? 0x80000000u : 0u);
  if (rem >= 14) {  // no room for the length: it goes into one more block of zeros
    sha256_block(st, w);
#pragma unroll
    for (int j = 0; j < 14; ++j) w[j] = 0;
  }
  w[14] = uint32_t(bits >> 32);
  w[15] = uint32_t(bits);
  sha256_block(st, w);
  uint8_t* o = out + r * 32;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // the digest is the state words, big-endian
    o[4 * i] = uint8_t(st[i] >> 24);
    o[4 * i + 1] = uint8_t(st[i] >> 16);
    o[4 * i + 2] = uint8_t(st[i] >> 8);
    o[4 * i + 3] = uint8_t(st[i]);
  }
}

}  // namespace atlas::cuda::kern
