// The per-(batch, head) kernels of SaPE² and CoPE attention: line gates, read-outs, distances
// and their backward, on raw pointers (no ATen). Included once, by attend.cpp, whose operators
// run them chunk by chunk inside the whole attention; what each fuses is described in
// ../_kernels.py and docs/encodings.md. Everything here has internal linkage (one translation
// unit): the vectorised functions are built twice (HOT: target_clones avx2 / default).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

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
      sqdist_chunks(sxT.data(), sxb + i * W, c0, Np, W, wx.data());    // squared distances, as the forward
      sqdist_chunks(syT.data(), syb + i * H, c0, Np, H, wy.data());
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

}  // namespace
