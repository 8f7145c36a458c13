// Fused C++ CPU kernels for the hot part of SaPE² and CoPE attention (vitpe_core/encodings/functional.py:
// `sape2_attention`, `cope_attention`). Built on first use by ../_kernels.py with
// torch.utils.cpp_extension.load (-O3, OpenMP, no -march); what each kernel fuses is described there.
// Bound functions: sape2_attend_fwd / _bwd, cope_attend_fwd / _bwd (float32 / float64 CPU tensors,
// contiguous).
// Lean headers (the Tensor class, the few ops called, parallel_for, the dtype switch, op registration),
// not <torch/extension.h>: that pulls in all of libtorch's C++ API and pybind11 and made the one-time
// build take ~2.5x as long (BENCHMARKS.md, section 1's build time).
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/library.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <algorithm>

namespace {

template <typename T> __attribute__((always_inline)) inline T sigm(T x) { return T(1) / (T(1) + std::exp(-x)); }

#define HOT __attribute__((target_clones("avx2", "default")))
#define INL __attribute__((always_inline)) inline

// σ over a[0..n), in place. float: a Cephes-style exp (≈1 ulp) written so that the compiler
// vectorises the loop (std::exp is a scalar libcall); double (tests, trace): std::exp.
INL void sigmoid_(double* a, int64_t n) { for (int64_t i = 0; i < n; ++i) a[i] = sigm(a[i]); }
INL void sigmoid_(float* a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float x = std::min(std::max(-a[i], -87.0f), 87.0f);         // exp(-a): no overflow, no denormals
    float t = x * 1.44269504088896341f;
    int k = (int)(t + (t >= 0.0f ? 0.5f : -0.5f));               // nearest integer
    float kf = (float)k;
    float r = (x - kf * 0.693359375f) + kf * 2.12194440e-4f;     // x − k ln 2, ln 2 split in two
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;                                  // exp(r), |r| <= ln2 / 2
    union { int i; float f; } s;
    s.i = (k + 127) << 23;                                       // 2^k
    a[i] = 1.0f / (1.0f + p * s.f);
  }
}

// Steps of one row of read-outs: zs[t] = z[t+1] − z[t] for t < M, 0 at M.
template <typename T>
INL void steps(const T* z, int64_t M, T* zs) {
  for (int64_t t = 0; t < M; ++t) zs[t] = z[t + 1] - z[t];
  zs[M] = 0;
}

// Backward of steps: the steps' gradient gzs adds into the read-outs' gradient gz, each element
// as gz[t] = (gz[t] + gzs[t-1]) - gzs[t] (the order of the one-step-at-a-time loop, so the same
// rounding) without its chain of stores and reloads through gz.
template <typename T>
INL void steps_bwd(const T* gzs, int64_t M, T* gz) {
  if (M < 1) return;
  gz[0] -= gzs[0];
  for (int64_t t = 1; t < M; ++t) gz[t] = (gz[t] + gzs[t - 1]) - gzs[t];
  gz[M] += gzs[M - 1];
}

// One line of gates g (already σ) -> descriptor desc[a] = z[lo] + f * zs[lo],
// pos[a] = min(sum_{b >= a} g[b], M), lo = floor pos, f = pos - lo.
template <typename T>
INL void line_fwd(const T* g, int64_t A, const T* z, const T* zs, int64_t M, T* desc) {
  T p = 0;
  for (int64_t a = A - 1; a >= 0; --a) {
    p += g[a];
    T pos = std::min(p, T(M));
    int64_t l = (int64_t)pos;                   // pos >= 0: truncation is floor (no libcall on SSE2)
    desc[a] = z[l] + zs[l] * (pos - T(l));
  }
}

// Backward of line_fwd: gd = d desc -> adds into gz / gzs (read-outs, steps), returns the
// gate logits' gradient in gl.
template <typename T>
INL void line_bwd(const T* g, const T* gd, int64_t A, const T* zs, int64_t M, T* gz, T* gzs, T* gl) {
  T p = 0;
  for (int64_t a = A - 1; a >= 0; --a) {       // recompute lo, f exactly as the forward
    p += g[a];
    T pos = std::min(p, T(M));
    int64_t l = (int64_t)pos;
    gz[l] += gd[a];
    gzs[l] += gd[a] * (pos - T(l));
    gl[a] = gd[a] * zs[l];                      // d pos[a]
  }
  T c = 0;                                      // pos = reverse cumsum: its adjoint is a cumsum
  for (int64_t a = 0; a < A; ++a) {
    c += gl[a];
    gl[a] = c * g[a] * (T(1) - g[a]);
  }
}

// Distances in chunks of C = 8 (float) / 4 (double) columns with GCC vector types (32 bytes;
// the compiler splits them in two on a CPU without AVX): a chunk's squared distance is summed
// in a register over the m coordinates. Only chunks that reach above the diagonal are
// computed (the matrix is symmetric). sT is m x Np (Np = N rounded up to C, zero-padded).
template <typename T> struct Chunk { static constexpr int C = 32 / sizeof(T); typedef T V __attribute__((vector_size(32))); };

template <typename V, typename T> INL V vload(const T* p) { V v; __builtin_memcpy(&v, p, sizeof(V)); return v; }
template <typename V, typename T> INL void vstore(T* p, V v) { __builtin_memcpy(p, &v, sizeof(V)); }

// d2[n] for n in [c0, Np): squared distances of s_i (si) to s_n.
template <typename T>
INL void sqdist_chunks(const T* sT, const T* si, int64_t c0, int64_t Np, int64_t m, T* d2) {
  typedef typename Chunk<T>::V V;
  constexpr int C = Chunk<T>::C;
  for (int64_t c = c0; c < Np; c += C) {
    V acc = {};
    for (int64_t k = 0; k < m; ++k) {
      V d = si[k] - vload<V>(sT + k * Np + c);
      acc += d * d;
    }
    vstore(d2 + c, acc);
  }
}

template <typename T>
INL void transpose_pad(const T* s, int64_t N, int64_t Np, int64_t m, T* sT) {
  for (int64_t k = 0; k < m; ++k) {
    for (int64_t n = 0; n < N; ++n) sT[k * Np + n] = s[n * m + k];
    for (int64_t n = N; n < Np; ++n) sT[k * Np + n] = 0;
  }
}

// Per (batch, head) b in [b0, b1): gates of every row and column line (σ of the logits on
// them), descriptors, and the distances added into the logits. The distance matrix is
// symmetric: each pair i < n is computed once and added at (i, n) and (n, i); (i, i) is 0.
template <typename T>
INL void sape2_fwd_range(T* logits, const T* z, T* sx, T* sy, T* gx, T* gy, int64_t BH, int64_t Tt, int64_t P, int64_t H, int64_t W, int64_t np, int64_t b0, int64_t b1) {
  const int64_t N = H * W, M = np - 1, Z = 2 * np;
  constexpr int C = Chunk<T>::C;
  const int64_t Np = (N + C - 1) / C * C;
  std::vector<T> sxT(Np * W), syT(Np * H), d2x(Np), d2y(Np), zs(Z);
  for (int64_t b = b0; b < b1; ++b) {
    T* L = logits + b * Tt * Tt + P * Tt + P;            // patch block, row stride Tt
    const T* zb = z + (b * Tt + P) * Z;                  // the patches' read-outs
    T* sxb = sx + b * N * W; T* syb = sy + b * N * H;
    T* gxb = gx + b * N * W; T* gyb = gy + b * N * H;
    for (int64_t y = 0; y < H; ++y)                      // the lines' logits, then σ in one pass
      for (int64_t x = 0; x < W; ++x) {
        const int64_t n = y * W + x;
        const T* Ln = L + n * Tt;
        for (int64_t u = 0; u < W; ++u) gxb[n * W + u] = Ln[y * W + u];
        for (int64_t v = 0; v < H; ++v) gyb[n * H + v] = Ln[v * W + x];
      }
    sigmoid_(gxb, N * W);
    sigmoid_(gyb, N * H);
    for (int64_t n = 0; n < N; ++n) {
      const T* zn = zb + n * Z;
      steps(zn, M, zs.data()); steps(zn + np, M, zs.data() + np);
      line_fwd(gxb + n * W, W, zn, zs.data(), M, sxb + n * W);
      line_fwd(gyb + n * H, H, zn + np, zs.data() + np, M, syb + n * H);
    }
    transpose_pad(sxb, N, Np, W, sxT.data());
    transpose_pad(syb, N, Np, H, syT.data());
    for (int64_t i = 0; i < N; ++i) {
      const int64_t c0 = (i + 1) / C * C;
      sqdist_chunks(sxT.data(), sxb + i * W, c0, Np, W, d2x.data());
      sqdist_chunks(syT.data(), syb + i * H, c0, Np, H, d2y.data());
      for (int64_t n = c0; n < Np; ++n) d2x[n] = std::sqrt(d2x[n]) + std::sqrt(d2y[n]);
      T* row = L + i * Tt;
      for (int64_t n = i + 1; n < N; ++n) {
        row[n] += d2x[n];
        L[n * Tt + i] += d2x[n];
      }
    }
  }
}
HOT void sape2_fwd_one(float* logits, const float* z, float* sx, float* sy, float* gx, float* gy, int64_t BH, int64_t Tt, int64_t P, int64_t H, int64_t W, int64_t np, int64_t b0, int64_t b1) { sape2_fwd_range<float>(logits, z, sx, sy, gx, gy, BH, Tt, P, H, W, np, b0, b1); }
HOT void sape2_fwd_one(double* logits, const double* z, double* sx, double* sy, double* gx, double* gy, int64_t BH, int64_t Tt, int64_t P, int64_t H, int64_t W, int64_t np, int64_t b0, int64_t b1) { sape2_fwd_range<double>(logits, z, sx, sy, gx, gy, BH, Tt, P, H, W, np, b0, b1); }

// The pair weights' source: Gs[i][n] = G[i][n] + G[n][i] (the distance is symmetric) for the
// 8 x 8 tiles on and above the diagonal, Np columns, 0 past N; G's rows have stride Tt. A tile
// of G's columns is read as tile rows instead of one strided element at a time; a tile inside
// the N x N block (all of them when N is a multiple of 8) is copied without a bounds test per
// element (the tests kept the compiler from vectorising: 20 % of the backward). The weights
// read only n > i.
template <typename T>
INL void symmetric_upper(const T* G, int64_t Tt, int64_t N, int64_t Np, T* Gs) {
  constexpr int B = 8;
  T tileT[B][B];                                           // tileT[a][b] = G[n0 + b][i0 + a]
  for (int64_t i0 = 0; i0 < N; i0 += B)
    for (int64_t n0 = i0; n0 < Np; n0 += B) {
      if (n0 + B <= N && i0 + B <= N) {                    // inside the block: no bounds tests
        for (int b = 0; b < B; ++b)
          for (int a = 0; a < B; ++a) tileT[a][b] = G[(n0 + b) * Tt + i0 + a];
        for (int a = 0; a < B; ++a)
          for (int b = 0; b < B; ++b) Gs[(i0 + a) * Np + n0 + b] = G[(i0 + a) * Tt + n0 + b] + tileT[a][b];
        continue;
      }
      for (int b = 0; b < B; ++b)
        for (int a = 0; a < B; ++a)
          tileT[a][b] = (n0 + b < N && i0 + a < N) ? G[(n0 + b) * Tt + i0 + a] : T(0);
      for (int a = 0; a < B && i0 + a < N; ++a) {
        const int64_t i = i0 + a;
        T* row = Gs + i * Np + n0;
        for (int b = 0; b < B && n0 + b < Np; ++b)     // Np is a multiple of the chunk, not of B
          row[b] = n0 + b < N ? G[i * Tt + n0 + b] + tileT[a][b] : T(0);
      }
    }
}

// Rows of s (N x m) copied into N x mp, each row zero-padded to mp (a multiple of the chunk).
template <typename T>
INL void pad_rows(const T* s, int64_t N, int64_t m, int64_t mp, T* out) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < m; ++k) out[n * mp + k] = s[n * m + k];
    for (int64_t k = m; k < mp; ++k) out[n * mp + k] = 0;
  }
}

// Pairs i < n of one axis, rows of sP (N x mp): g_i += w[n] (s_i − s_n), g_n −= w[n] (s_i − s_n),
// a chunk of coordinates at a time: the sums stay in vector lanes (the transposed layout the
// distances use would end each row in horizontal sums, ~12 % of the backward).
template <typename T>
INL void pair_grad_rows(const T* sP, const T* w, int64_t i, int64_t N, int64_t mp, T* gP) {
  typedef typename Chunk<T>::V V;
  constexpr int C = Chunk<T>::C;
  for (int64_t j = 0; j < mp; j += C) {
    const V si = vload<V>(sP + i * mp + j);
    V acc = {};
    for (int64_t n = i + 1; n < N; ++n) {
      const V t = w[n] * (si - vload<V>(sP + n * mp + j));
      acc += t;
      vstore(gP + n * mp + j, vload<V>(gP + n * mp + j) - t);
    }
    vstore(gP + i * mp + j, vload<V>(gP + i * mp + j) + acc);
  }
}

template <typename T>
INL void sape2_bwd_range(T* gl, const T* z, const T* sx, const T* sy, const T* gx, const T* gy, T* gz, int64_t BH, int64_t Tt, int64_t P, int64_t H, int64_t W, int64_t np, int64_t b0, int64_t b1) {
  typedef typename Chunk<T>::V V;
  const int64_t N = H * W, M = np - 1, Z = 2 * np;
  constexpr int C = Chunk<T>::C;
  const int64_t Np = (N + C - 1) / C * C, Wp = (W + C - 1) / C * C, Hp = (H + C - 1) / C * C;
  std::vector<T> sxT(Np * W), syT(Np * H), sxP(N * Wp), syP(N * Hp), gsx(N * Wp), gsy(N * Hp),
      Gs(Np * Np), wx(Np), wy(Np), gline(std::max(H, W)), zs(Z), gzs(Z);
  for (int64_t b = b0; b < b1; ++b) {
    T* G = gl + b * Tt * Tt + P * Tt + P;
    const T* zb = z + (b * Tt + P) * Z;
    T* gzb = gz + (b * Tt + P) * Z;
    const T* sxb = sx + b * N * W; const T* syb = sy + b * N * H;
    const T* gxb = gx + b * N * W; const T* gyb = gy + b * N * H;
    transpose_pad(sxb, N, Np, W, sxT.data());
    transpose_pad(syb, N, Np, H, syT.data());
    pad_rows(sxb, N, W, Wp, sxP.data());
    pad_rows(syb, N, H, Hp, syP.data());
    symmetric_upper(G, Tt, N, Np, Gs.data());
    std::fill(gsx.begin(), gsx.end(), T(0)); std::fill(gsy.begin(), gsy.end(), T(0));
    for (int64_t i = 0; i < N; ++i) {                    // pairs i < n (Gs is 0 elsewhere)
      const int64_t c0 = (i + 1) / C * C;
      const T* sxi = sxb + i * W; const T* syi = syb + i * H;
      for (int64_t c = c0; c < Np; c += C) {             // squared distances, 8 (4) pairs at a time
        V ax = {}, ay = {};
        for (int64_t k = 0; k < W; ++k) { V d = sxi[k] - vload<V>(sxT.data() + k * Np + c); ax += d * d; }
        for (int64_t k = 0; k < H; ++k) { V d = syi[k] - vload<V>(syT.data() + k * Np + c); ay += d * d; }
        vstore(wx.data() + c, ax); vstore(wy.data() + c, ay);
      }
      const T* gs = Gs.data() + i * Np;
      for (int64_t n = c0; n < Np; ++n) {                // weight Gs / distance, 0 where the distance is
        T dx = std::sqrt(wx[n]), dy = std::sqrt(wy[n]);
        wx[n] = (n > i && dx > T(0)) ? gs[n] / dx : T(0);
        wy[n] = (n > i && dy > T(0)) ? gs[n] / dy : T(0);
      }
      pair_grad_rows(sxP.data(), wx.data(), i, N, Wp, gsx.data());
      pair_grad_rows(syP.data(), wy.data(), i, N, Hp, gsy.data());
    }
    for (int64_t y = 0; y < H; ++y)                      // lines; gates' gradient into G
      for (int64_t x = 0; x < W; ++x) {
        const int64_t n = y * W + x;
        const T* zn = zb + n * Z;
        T* gzn = gzb + n * Z;
        T* Gr = G + n * Tt;
        steps(zn, M, zs.data()); steps(zn + np, M, zs.data() + np);
        std::fill(gzs.begin(), gzs.end(), T(0));
        line_bwd(gxb + n * W, gsx.data() + n * Wp, W, zs.data(), M, gzn, gzs.data(), gline.data());
        for (int64_t u = 0; u < W; ++u) Gr[y * W + u] += gline[u];
        line_bwd(gyb + n * H, gsy.data() + n * Hp, H, zs.data() + np, M, gzn + np, gzs.data() + np, gline.data());
        for (int64_t v = 0; v < H; ++v) Gr[v * W + x] += gline[v];
        steps_bwd(gzs.data(), M, gzn); steps_bwd(gzs.data() + np, M, gzn + np);
      }
  }
}
HOT void sape2_bwd_one(float* gl, const float* z, const float* sx, const float* sy, const float* gx, const float* gy, float* gz, int64_t BH, int64_t Tt, int64_t P, int64_t H, int64_t W, int64_t np, int64_t b0, int64_t b1) { sape2_bwd_range<float>(gl, z, sx, sy, gx, gy, gz, BH, Tt, P, H, W, np, b0, b1); }
HOT void sape2_bwd_one(double* gl, const double* z, const double* sx, const double* sy, const double* gx, const double* gy, double* gz, int64_t BH, int64_t Tt, int64_t P, int64_t H, int64_t W, int64_t np, int64_t b0, int64_t b1) { sape2_bwd_range<double>(gl, z, sx, sy, gx, gy, gz, BH, Tt, P, H, W, np, b0, b1); }

// CoPE, keys in their own order: each row of logits is one line of line_fwd (gates g = σ of
// the logits, pos[j] = min(sum_{t >= j} g[t], M)), its descriptor added as the bias.
template <typename T>
INL void cope_fwd_range(T* logits, const T* z, const T* gates, int64_t BH, int64_t Tt, int64_t np, int64_t r0, int64_t r1) {
  const int64_t M = np - 1;
  std::vector<T> zs(np), desc(Tt);
  for (int64_t r = r0; r < r1; ++r) {
    T* l = logits + r * Tt;
    steps(z + r * np, M, zs.data());
    line_fwd(gates + r * Tt, Tt, z + r * np, zs.data(), M, desc.data());
    for (int64_t j = 0; j < Tt; ++j) l[j] += desc[j];
  }
}
HOT void cope_fwd_one(float* logits, const float* z, const float* gates, int64_t BH, int64_t Tt, int64_t np, int64_t r0, int64_t r1) { cope_fwd_range<float>(logits, z, gates, BH, Tt, np, r0, r1); }
HOT void cope_fwd_one(double* logits, const double* z, const double* gates, int64_t BH, int64_t Tt, int64_t np, int64_t r0, int64_t r1) { cope_fwd_range<double>(logits, z, gates, BH, Tt, np, r0, r1); }

// Backward: gl holds d logits; the gates are σ of the same logits, so their gradient adds into it.
template <typename T>
INL void cope_bwd_range(T* gl, const T* z, const T* gates, T* gz, int64_t BH, int64_t Tt, int64_t np, int64_t r0, int64_t r1) {
  const int64_t M = np - 1;
  std::vector<T> zs(np), gzs(np), dg(Tt);
  for (int64_t r = r0; r < r1; ++r) {
    T* G = gl + r * Tt;
    steps(z + r * np, M, zs.data());
    std::fill(gzs.begin(), gzs.end(), T(0));
    line_bwd(gates + r * Tt, G, Tt, zs.data(), M, gz + r * np, gzs.data(), dg.data());
    steps_bwd(gzs.data(), M, gz + r * np);
    for (int64_t j = 0; j < Tt; ++j) G[j] += dg[j];
  }
}
HOT void cope_bwd_one(float* gl, const float* z, const float* gates, float* gz, int64_t BH, int64_t Tt, int64_t np, int64_t r0, int64_t r1) { cope_bwd_range<float>(gl, z, gates, gz, BH, Tt, np, r0, r1); }
HOT void cope_bwd_one(double* gl, const double* z, const double* gates, double* gz, int64_t BH, int64_t Tt, int64_t np, int64_t r0, int64_t r1) { cope_bwd_range<double>(gl, z, gates, gz, BH, Tt, np, r0, r1); }

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be a contiguous CPU tensor");
}

// (batch, head) pairs per chunk of the whole-attention ops below: a chunk's T x T block (the
// attention weights, or the logits' gradient) about 256 KiB, so that it stays in the core's L2
// cache from the matmul that writes it through the SaPE² kernel and the softmax to the matmuls
// that read it (the whole (B, h, T, T) tensor, ~8.6 MB at batch 128 and 65 tokens, does not:
// op by op over all of it took twice as long). At least 1, and no more than an even share of
// the pairs per thread, so that small batches still use every thread.
int64_t pairs_per_chunk(int64_t BH, int64_t Tt, int64_t item) {
  const int64_t fit = std::max<int64_t>(1, (int64_t(256) << 10) / std::max<int64_t>(1, Tt * Tt * item));
  const int64_t share = (BH + at::get_num_threads() - 1) / at::get_num_threads();
  return std::max<int64_t>(1, std::min(fit, share));
}

}  // namespace

// The whole SaPE² attention, forward: q_s = q·scale (B, h, T, d), k (B, h, T, d), v (B, h, T, dv),
// z (B, h, T, 2 np): every token's read-outs of E_x, then E_y (the prefix tokens' rows are not
// read). Chunk by chunk of (batch, head) pairs, each chunk in one thread: logits = q_s·kᵀ, the
// distances added in place (sape2_fwd_range), softmax in place, out = attn·v. Returns out,
// attn (B, h, T, T, kept for the backward), the descriptors s_x (B,h,N,W), s_y (B,h,N,H) and the
// line gates g_x, g_y alike.
std::vector<at::Tensor> sape2_attend_fwd(at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor z, int64_t P,
                                         int64_t H, int64_t W, int64_t np) {
  check(q_s, "q_s"); check(k, "k"); check(v, "v"); check(z, "z");
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), d = q_s.size(3), dv = v.size(3);
  const int64_t N = H * W, BH = B * h;
  TORCH_CHECK(Tt == P + N && z.size(2) == Tt && z.size(3) == 2 * np && k.sizes() == q_s.sizes()
              && v.size(2) == Tt && k.scalar_type() == q_s.scalar_type() && v.scalar_type() == q_s.scalar_type()
              && z.scalar_type() == q_s.scalar_type(), "sape2_attend_fwd: shape or dtype mismatch");
  auto o = q_s.options();
  auto attn = at::empty({B, h, Tt, Tt}, o), out = at::empty({B, h, Tt, dv}, o);
  auto sx = at::empty({B, h, N, W}, o), sy = at::empty({B, h, N, H}, o);
  auto gx = at::empty({B, h, N, W}, o), gy = at::empty({B, h, N, H}, o);
  auto q3 = q_s.view({BH, Tt, d}), k3 = k.view({BH, Tt, d}), v3 = v.view({BH, Tt, dv});
  auto a3 = attn.view({BH, Tt, Tt}), o3 = out.view({BH, Tt, dv});
  const int64_t C = pairs_per_chunk(BH, Tt, q_s.element_size());
  at::parallel_for(0, BH, C, [&](int64_t b0, int64_t b1) {
    c10::AutoGradMode no_grad(false);                     // plain tensors: no autograd in the workers
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (int64_t c0 = b0; c0 < b1; c0 += C) {
      const int64_t c1 = std::min(c0 + C, b1), n = c1 - c0;
      auto a = a3.slice(0, c0, c1);
      at::bmm_out(a, q3.slice(0, c0, c1), k3.slice(0, c0, c1).transpose(1, 2));
      AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "sape2_attend_fwd", [&] {
        sape2_fwd_one(a.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * 2 * np,
                      sx.data_ptr<scalar_t>() + c0 * N * W, sy.data_ptr<scalar_t>() + c0 * N * H,
                      gx.data_ptr<scalar_t>() + c0 * N * W, gy.data_ptr<scalar_t>() + c0 * N * H,
                      n, Tt, P, H, W, np, 0, n);
      });
      at::_softmax_out(a, a, -1, false);
      auto oc = o3.slice(0, c0, c1);
      at::bmm_out(oc, a, v3.slice(0, c0, c1));
    }
  });
  return {out, attn, sx, sy, gx, gy};
}

// The whole SaPE² attention, backward, chunk by chunk as the forward: the logits' gradient
// (softmax backward, then sape2_bwd_range) lives only in a per-thread chunk buffer. Writes
// the gradients of q (as q = q_s / scale), k and v into gq, gk, gv (contiguous, B, h, T, d|dv)
// and returns that of z (B, h, T, 2 np), 0 in the prefix rows.
at::Tensor sape2_attend_bwd(at::Tensor g, at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor attn,
                            at::Tensor z, at::Tensor sx, at::Tensor sy, at::Tensor gx, at::Tensor gy,
                            at::Tensor gq, at::Tensor gk, at::Tensor gv, double scale, int64_t P, int64_t H,
                            int64_t W, int64_t np) {
  for (auto& [t, name] : std::vector<std::pair<at::Tensor*, const char*>>{
           {&g, "grad_out"}, {&q_s, "q_s"}, {&k, "k"}, {&v, "v"}, {&attn, "attn"}, {&z, "z"}, {&sx, "s_x"},
           {&sy, "s_y"}, {&gx, "g_x"}, {&gy, "g_y"}, {&gq, "grad_q"}, {&gk, "grad_k"}, {&gv, "grad_v"}})
    check(*t, name);
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), d = q_s.size(3), dv = v.size(3);
  const int64_t N = H * W, BH = B * h;
  TORCH_CHECK(attn.size(2) == Tt && attn.size(3) == Tt && g.sizes() == v.sizes() && gq.sizes() == q_s.sizes()
              && gk.sizes() == k.sizes() && gv.sizes() == v.sizes(), "sape2_attend_bwd: shape mismatch");
  auto gz = at::zeros_like(z);
  auto q3 = q_s.view({BH, Tt, d}), k3 = k.view({BH, Tt, d}), v3 = v.view({BH, Tt, dv});
  auto a3 = attn.view({BH, Tt, Tt}), g3 = g.view({BH, Tt, dv});
  auto gq3 = gq.view({BH, Tt, d}), gk3 = gk.view({BH, Tt, d}), gv3 = gv.view({BH, Tt, dv});
  const int64_t C = pairs_per_chunk(BH, Tt, q_s.element_size());
  at::parallel_for(0, BH, C, [&](int64_t b0, int64_t b1) {
    c10::AutoGradMode no_grad(false);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto buf = at::empty({std::min(C, b1 - b0), Tt, Tt}, q_s.options());
    for (int64_t c0 = b0; c0 < b1; c0 += C) {
      const int64_t c1 = std::min(c0 + C, b1), n = c1 - c0;
      auto a = a3.slice(0, c0, c1), gc = g3.slice(0, c0, c1), G = buf.slice(0, 0, n);
      auto gvc = gv3.slice(0, c0, c1), gkc = gk3.slice(0, c0, c1), gqc = gq3.slice(0, c0, c1);
      at::bmm_out(gvc, a.transpose(1, 2), gc);
      at::bmm_out(G, gc, v3.slice(0, c0, c1).transpose(1, 2));
      at::_softmax_backward_data_out(G, G, a, -1, a.scalar_type());
      AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "sape2_attend_bwd", [&] {
        sape2_bwd_one(G.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * 2 * np,
                      sx.data_ptr<scalar_t>() + c0 * N * W, sy.data_ptr<scalar_t>() + c0 * N * H,
                      gx.data_ptr<scalar_t>() + c0 * N * W, gy.data_ptr<scalar_t>() + c0 * N * H,
                      gz.data_ptr<scalar_t>() + c0 * Tt * 2 * np, n, Tt, P, H, W, np, 0, n);
      });
      at::bmm_out(gqc, G, k3.slice(0, c0, c1));
      gqc.mul_(scale);
      at::bmm_out(gkc, G.transpose(1, 2), q3.slice(0, c0, c1));
    }
  });
  return gz;
}

// The whole CoPE attention, forward, chunk by chunk as sape2_attend_fwd: logits = q_s·kᵀ, gates =
// σ(logits) (kept), the bias added in place (cope_fwd_range), softmax in place, out = attn·v.
// z = q·e (B, h, T, np). Returns out, attn and gates.
std::vector<at::Tensor> cope_attend_fwd(at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor z, int64_t np) {
  check(q_s, "q_s"); check(k, "k"); check(v, "v"); check(z, "z");
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), d = q_s.size(3), dv = v.size(3), BH = B * h;
  TORCH_CHECK(z.size(2) == Tt && z.size(3) == np && k.sizes() == q_s.sizes() && v.size(2) == Tt
              && k.scalar_type() == q_s.scalar_type() && v.scalar_type() == q_s.scalar_type()
              && z.scalar_type() == q_s.scalar_type(), "cope_attend_fwd: shape or dtype mismatch");
  auto o = q_s.options();
  auto attn = at::empty({B, h, Tt, Tt}, o), gates = at::empty({B, h, Tt, Tt}, o), out = at::empty({B, h, Tt, dv}, o);
  auto q3 = q_s.view({BH, Tt, d}), k3 = k.view({BH, Tt, d}), v3 = v.view({BH, Tt, dv});
  auto a3 = attn.view({BH, Tt, Tt}), g3 = gates.view({BH, Tt, Tt}), o3 = out.view({BH, Tt, dv});
  const int64_t C = pairs_per_chunk(BH, Tt, q_s.element_size());
  at::parallel_for(0, BH, C, [&](int64_t b0, int64_t b1) {
    c10::AutoGradMode no_grad(false);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    for (int64_t c0 = b0; c0 < b1; c0 += C) {
      const int64_t c1 = std::min(c0 + C, b1), n = c1 - c0;
      auto a = a3.slice(0, c0, c1), gc = g3.slice(0, c0, c1), oc = o3.slice(0, c0, c1);
      at::bmm_out(a, q3.slice(0, c0, c1), k3.slice(0, c0, c1).transpose(1, 2));
      at::sigmoid_out(gc, a);
      AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "cope_attend_fwd", [&] {
        cope_fwd_one(a.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * np, gc.data_ptr<scalar_t>(),
                     n, Tt, np, 0, n * Tt);
      });
      at::_softmax_out(a, a, -1, false);
      at::bmm_out(oc, a, v3.slice(0, c0, c1));
    }
  });
  return {out, attn, gates};
}

// The whole CoPE attention, backward, chunk by chunk as sape2_attend_bwd: writes the gradients of
// q (as q = q_s / scale; without z's part), k and v into gq, gk, gv and returns that of z.
at::Tensor cope_attend_bwd(at::Tensor g, at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor attn,
                           at::Tensor gates, at::Tensor z, at::Tensor gq, at::Tensor gk, at::Tensor gv, double scale,
                           int64_t np) {
  for (auto& [t, name] : std::vector<std::pair<at::Tensor*, const char*>>{
           {&g, "grad_out"}, {&q_s, "q_s"}, {&k, "k"}, {&v, "v"}, {&attn, "attn"}, {&gates, "gates"}, {&z, "z"},
           {&gq, "grad_q"}, {&gk, "grad_k"}, {&gv, "grad_v"}})
    check(*t, name);
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), d = q_s.size(3), dv = v.size(3), BH = B * h;
  TORCH_CHECK(attn.size(2) == Tt && attn.size(3) == Tt && gates.sizes() == attn.sizes() && g.sizes() == v.sizes()
              && gq.sizes() == q_s.sizes() && gk.sizes() == k.sizes() && gv.sizes() == v.sizes(),
              "cope_attend_bwd: shape mismatch");
  auto gz = at::zeros_like(z);
  auto q3 = q_s.view({BH, Tt, d}), k3 = k.view({BH, Tt, d}), v3 = v.view({BH, Tt, dv});
  auto a3 = attn.view({BH, Tt, Tt}), g3 = g.view({BH, Tt, dv});
  auto gq3 = gq.view({BH, Tt, d}), gk3 = gk.view({BH, Tt, d}), gv3 = gv.view({BH, Tt, dv});
  const int64_t C = pairs_per_chunk(BH, Tt, q_s.element_size());
  at::parallel_for(0, BH, C, [&](int64_t b0, int64_t b1) {
    c10::AutoGradMode no_grad(false);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    auto buf = at::empty({std::min(C, b1 - b0), Tt, Tt}, q_s.options());
    for (int64_t c0 = b0; c0 < b1; c0 += C) {
      const int64_t c1 = std::min(c0 + C, b1), n = c1 - c0;
      auto a = a3.slice(0, c0, c1), gc = g3.slice(0, c0, c1), G = buf.slice(0, 0, n);
      auto gvc = gv3.slice(0, c0, c1), gkc = gk3.slice(0, c0, c1), gqc = gq3.slice(0, c0, c1);
      at::bmm_out(gvc, a.transpose(1, 2), gc);
      at::bmm_out(G, gc, v3.slice(0, c0, c1).transpose(1, 2));
      at::_softmax_backward_data_out(G, G, a, -1, a.scalar_type());
      AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "cope_attend_bwd", [&] {
        cope_bwd_one(G.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * np,
                     gates.data_ptr<scalar_t>() + c0 * Tt * Tt, gz.data_ptr<scalar_t>() + c0 * Tt * np,
                     n, Tt, np, 0, n * Tt);
      });
      at::bmm_out(gqc, G, k3.slice(0, c0, c1));
      gqc.mul_(scale);
      at::bmm_out(gkc, G.transpose(1, 2), q3.slice(0, c0, c1));
    }
  });
  return gz;
}

// Registered as torch operators in a namespace named after the build (`torch.ops.<name>.sape2_attend_fwd`, ...):
// no pybind11. A failed TORCH_CHECK reaches Python as a RuntimeError.
TORCH_LIBRARY(TORCH_EXTENSION_NAME, m) {
  m.def("sape2_attend_fwd", &sape2_attend_fwd);
  m.def("sape2_attend_bwd", &sape2_attend_bwd);
  m.def("cope_attend_fwd", &cope_attend_fwd);
  m.def("cope_attend_bwd", &cope_attend_bwd);
}
