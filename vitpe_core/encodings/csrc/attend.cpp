// The fused SaPE² and CoPE attention as torch operators (vitpe_core/encodings/functional.py:
// `sape2_attention`, `cope_attention`): sape2_attend_fwd / _bwd, cope_attend_fwd / _bwd (float32 /
// float64 CPU tensors, contiguous). Each runs the whole attention chunk by chunk of (batch, head)
// pairs, ATen's matmuls and softmax around the per-(batch, head) kernels of attend_kernels.h.
// Built on first use by ../_kernels.py with torch.utils.cpp_extension.load (-O3, OpenMP, no -march).
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
#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <vector>

#include "attend_kernels.h"

namespace {

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be a contiguous CPU tensor");
}

// Every tensor 4-d (B, h, ., .) with the batch and head counts of the first, and its dtype.
void check_bh(std::initializer_list<const at::Tensor*> ts, const char* op) {
  const at::Tensor& a = **ts.begin();
  for (const at::Tensor* t : ts)
    TORCH_CHECK(t->dim() == 4 && t->size(0) == a.size(0) && t->size(1) == a.size(1)
                && t->scalar_type() == a.scalar_type(), op, ": every tensor must be (B, h, ., .) of one dtype");
}

// (batch, head) pairs per chunk of the whole-attention ops below: a chunk's T x T block (the
// attention weights, or the logits' gradient) about 256 KiB, so that it stays in the core's L2
// cache from the matmul that writes it through the SaPE² kernel and the softmax to the matmuls
// that read it (the whole (B, h, T, T) tensor, ~8.6 MB at batch 128 and 65 tokens, does not:
// op by op over all of it took ~1.7x as long). At least 1, and no more than an even share of
// the pairs per thread, so that small batches still use every thread.
int64_t pairs_per_chunk(int64_t BH, int64_t Tt, int64_t item) {
  const int64_t fit = std::max<int64_t>(1, (int64_t(256) << 10) / std::max<int64_t>(1, Tt * Tt * item));
  const int64_t share = (BH + at::get_num_threads() - 1) / at::get_num_threads();
  return std::max<int64_t>(1, std::min(fit, share));
}

// Runs body(c0, c1, scratch) over the chunks [c0, c1) of C pairs in [0, BH), handed out one at a
// time from a shared counter to torch's threads: a thread slowed by another process on the host
// does fewer chunks instead of leaving the others idle at the end. Each thread dispatches as on
// plain tensors (no autograd, no inference-mode checks: a worker does not inherit the caller's
// modes) and, when scratch_T > 0, has its own C x scratch_T x scratch_T scratch tensor.
template <typename Body>
void for_chunks(int64_t BH, int64_t C, const at::TensorOptions& o, int64_t scratch_T, const Body& body) {
  const int64_t chunks = (BH + C - 1) / C;
  const int64_t workers = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), chunks));
  std::atomic<int64_t> next{0};
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    c10::AutoGradMode no_grad(false);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    at::Tensor scratch = scratch_T > 0 ? at::empty({C, scratch_T, scratch_T}, o) : at::Tensor();
    for (int64_t i = next.fetch_add(1); i < chunks; i = next.fetch_add(1))
      body(i * C, std::min(BH, (i + 1) * C), scratch);
  });
}

// The attention around an encoding's bias, forward, chunk by chunk (for_chunks): logits = q_s·kᵀ
// written into attn, add_bias(c0, c1, logits of pairs [c0, c1)) adds the bias in place, softmax in
// place, out = attn·v. q_s, k (B, h, T, d), v (B, h, T, dv). Returns {out, attn}.
template <typename AddBias>
std::vector<at::Tensor> attend_fwd(const char* op, const at::Tensor& q_s, const at::Tensor& k, const at::Tensor& v,
                                   const AddBias& add_bias) {
  check(q_s, "q_s"); check(k, "k"); check(v, "v");
  check_bh({&q_s, &k, &v}, op);
  TORCH_CHECK(k.sizes() == q_s.sizes() && v.size(2) == q_s.size(2), op, ": shape or dtype mismatch");
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), d = q_s.size(3), dv = v.size(3), BH = B * h;
  auto attn = at::empty({B, h, Tt, Tt}, q_s.options()), out = at::empty({B, h, Tt, dv}, q_s.options());
  auto q3 = q_s.view({BH, Tt, d}), k3 = k.view({BH, Tt, d}), v3 = v.view({BH, Tt, dv});
  auto a3 = attn.view({BH, Tt, Tt}), o3 = out.view({BH, Tt, dv});
  const int64_t C = pairs_per_chunk(BH, Tt, q_s.element_size());
  for_chunks(BH, C, q_s.options(), 0, [&](int64_t c0, int64_t c1, at::Tensor&) {
    auto a = a3.slice(0, c0, c1), oc = o3.slice(0, c0, c1);
    at::bmm_out(a, q3.slice(0, c0, c1), k3.slice(0, c0, c1).transpose(1, 2));
    add_bias(c0, c1, a);
    at::_softmax_out(a, a, -1, false);
    at::bmm_out(oc, a, v3.slice(0, c0, c1));
  });
  return {out, attn};
}

// The same attention, backward, chunk by chunk: the logits' gradient G lives only in a per-thread
// chunk buffer (softmax backward of g·vᵀ), grad_bias(c0, c1, G) adds the bias inputs' part into it
// in place and writes the encoding's own gradients; then the gradients of q (as q = q_s / scale),
// k and v go into gq, gk, gv (contiguous).
template <typename GradBias>
void attend_bwd(const char* op, const at::Tensor& g, const at::Tensor& q_s, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& attn, const at::Tensor& gq, const at::Tensor& gk, const at::Tensor& gv, double scale,
                const GradBias& grad_bias) {
  for (auto& [t, name] : std::vector<std::pair<const at::Tensor*, const char*>>{
           {&g, "grad_out"}, {&q_s, "q_s"}, {&k, "k"}, {&v, "v"}, {&attn, "attn"}, {&gq, "grad_q"}, {&gk, "grad_k"},
           {&gv, "grad_v"}})
    check(*t, name);
  check_bh({&q_s, &g, &k, &v, &attn, &gq, &gk, &gv}, op);
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), d = q_s.size(3), dv = v.size(3), BH = B * h;
  TORCH_CHECK(attn.size(2) == Tt && attn.size(3) == Tt && g.sizes() == v.sizes() && gq.sizes() == q_s.sizes()
              && gk.sizes() == k.sizes() && gv.sizes() == v.sizes(), op, ": shape mismatch");
  auto q3 = q_s.view({BH, Tt, d}), k3 = k.view({BH, Tt, d}), v3 = v.view({BH, Tt, dv});
  auto a3 = attn.view({BH, Tt, Tt}), g3 = g.view({BH, Tt, dv});
  auto gq3 = gq.view({BH, Tt, d}), gk3 = gk.view({BH, Tt, d}), gv3 = gv.view({BH, Tt, dv});
  const int64_t C = pairs_per_chunk(BH, Tt, q_s.element_size());
  for_chunks(BH, C, q_s.options(), Tt, [&](int64_t c0, int64_t c1, at::Tensor& buf) {
    auto a = a3.slice(0, c0, c1), gc = g3.slice(0, c0, c1), G = buf.slice(0, 0, c1 - c0);
    auto gvc = gv3.slice(0, c0, c1), gkc = gk3.slice(0, c0, c1), gqc = gq3.slice(0, c0, c1);
    at::bmm_out(gvc, a.transpose(1, 2), gc);
    at::bmm_out(G, gc, v3.slice(0, c0, c1).transpose(1, 2));
    at::_softmax_backward_data_out(G, G, a, -1, a.scalar_type());
    grad_bias(c0, c1, G);
    at::bmm_out(gqc, G, k3.slice(0, c0, c1));
    gqc.mul_(scale);
    at::bmm_out(gkc, G.transpose(1, 2), q3.slice(0, c0, c1));
  });
}

}  // namespace

// The whole SaPE² attention, forward (attend_fwd around sape2_fwd_range): q_s = q·scale
// (B, h, T, d), k (B, h, T, d), v (B, h, T, dv), z (B, h, T, 2 np): every token's read-outs of
// E_x, then E_y (the prefix tokens' rows are not read); the distances added into each chunk's
// logits. Returns out, attn (B, h, T, T, kept for the backward), the descriptors s_x (B,h,N,W),
// s_y (B,h,N,H) and the line gates g_x, g_y alike.
std::vector<at::Tensor> sape2_attend_fwd(at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor z, int64_t P,
                                         int64_t H, int64_t W, int64_t np) {
  check(z, "z");
  check_bh({&q_s, &z}, "sape2_attend_fwd");
  const int64_t B = q_s.size(0), h = q_s.size(1), Tt = q_s.size(2), N = H * W;
  TORCH_CHECK(Tt == P + N && z.size(2) == Tt && z.size(3) == 2 * np, "sape2_attend_fwd: shape or dtype mismatch");
  auto o = q_s.options();
  auto sx = at::empty({B, h, N, W}, o), sy = at::empty({B, h, N, H}, o);
  auto gx = at::empty({B, h, N, W}, o), gy = at::empty({B, h, N, H}, o);
  auto res = attend_fwd("sape2_attend_fwd", q_s, k, v, [&](int64_t c0, int64_t c1, at::Tensor& logits) {
    AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "sape2_attend_fwd", [&] {
      sape2_fwd_one(logits.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * 2 * np,
                    sx.data_ptr<scalar_t>() + c0 * N * W, sy.data_ptr<scalar_t>() + c0 * N * H,
                    gx.data_ptr<scalar_t>() + c0 * N * W, gy.data_ptr<scalar_t>() + c0 * N * H,
                    c1 - c0, Tt, P, H, W, np, 0, c1 - c0);
    });
  });
  return {res[0], res[1], sx, sy, gx, gy};
}

// The whole SaPE² attention, backward (attend_bwd around sape2_bwd_range): the gradients of q, k
// and v into gq, gk, gv; returns that of z (B, h, T, 2 np), 0 in the prefix rows.
at::Tensor sape2_attend_bwd(at::Tensor g, at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor attn,
                            at::Tensor z, at::Tensor sx, at::Tensor sy, at::Tensor gx, at::Tensor gy,
                            at::Tensor gq, at::Tensor gk, at::Tensor gv, double scale, int64_t P, int64_t H,
                            int64_t W, int64_t np) {
  check(z, "z"); check(sx, "s_x"); check(sy, "s_y"); check(gx, "g_x"); check(gy, "g_y");
  check_bh({&q_s, &z, &sx, &sy, &gx, &gy}, "sape2_attend_bwd");
  const int64_t Tt = q_s.size(2), N = H * W;
  TORCH_CHECK(Tt == P + N && z.size(2) == Tt && z.size(3) == 2 * np && sx.size(2) == N && sx.size(3) == W
              && sy.size(2) == N && sy.size(3) == H && gx.sizes() == sx.sizes() && gy.sizes() == sy.sizes(),
              "sape2_attend_bwd: z or the saved lines do not match the grid");
  auto gz = at::zeros_like(z);
  attend_bwd("sape2_attend_bwd", g, q_s, k, v, attn, gq, gk, gv, scale, [&](int64_t c0, int64_t c1, at::Tensor& G) {
    AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "sape2_attend_bwd", [&] {
      sape2_bwd_one(G.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * 2 * np,
                    sx.data_ptr<scalar_t>() + c0 * N * W, sy.data_ptr<scalar_t>() + c0 * N * H,
                    gx.data_ptr<scalar_t>() + c0 * N * W, gy.data_ptr<scalar_t>() + c0 * N * H,
                    gz.data_ptr<scalar_t>() + c0 * Tt * 2 * np, c1 - c0, Tt, P, H, W, np, 0, c1 - c0);
    });
  });
  return gz;
}

// The whole CoPE attention, forward (attend_fwd around cope_fwd_range): gates = σ(logits) of each
// chunk (kept), the bias added in place. z = q·e (B, h, T, np). Returns out, attn and gates.
std::vector<at::Tensor> cope_attend_fwd(at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor z, int64_t np) {
  check(z, "z");
  check_bh({&q_s, &z}, "cope_attend_fwd");
  const int64_t Tt = q_s.size(2);
  TORCH_CHECK(z.size(2) == Tt && z.size(3) == np, "cope_attend_fwd: shape or dtype mismatch");
  auto gates = at::empty({q_s.size(0), q_s.size(1), Tt, Tt}, q_s.options());
  auto g3 = gates.view({q_s.size(0) * q_s.size(1), Tt, Tt});
  auto res = attend_fwd("cope_attend_fwd", q_s, k, v, [&](int64_t c0, int64_t c1, at::Tensor& logits) {
    auto gc = g3.slice(0, c0, c1);
    at::sigmoid_out(gc, logits);
    AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "cope_attend_fwd", [&] {
      cope_fwd_one(logits.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * np, gc.data_ptr<scalar_t>(),
                   c1 - c0, Tt, np, 0, (c1 - c0) * Tt);
    });
  });
  return {res[0], res[1], gates};
}

// The whole CoPE attention, backward (attend_bwd around cope_bwd_range): the gradients of q (without
// z's part), k and v into gq, gk, gv; returns that of z.
at::Tensor cope_attend_bwd(at::Tensor g, at::Tensor q_s, at::Tensor k, at::Tensor v, at::Tensor attn,
                           at::Tensor gates, at::Tensor z, at::Tensor gq, at::Tensor gk, at::Tensor gv, double scale,
                           int64_t np) {
  check(gates, "gates"); check(z, "z");
  check_bh({&q_s, &gates, &z}, "cope_attend_bwd");
  const int64_t Tt = q_s.size(2);
  TORCH_CHECK(z.size(2) == Tt && z.size(3) == np, "cope_attend_bwd: z must be (B, h, T, np)");
  TORCH_CHECK(gates.sizes() == attn.sizes(), "cope_attend_bwd: shape mismatch");
  auto gz = at::zeros_like(z);
  attend_bwd("cope_attend_bwd", g, q_s, k, v, attn, gq, gk, gv, scale, [&](int64_t c0, int64_t c1, at::Tensor& G) {
    AT_DISPATCH_FLOATING_TYPES(q_s.scalar_type(), "cope_attend_bwd", [&] {
      cope_bwd_one(G.data_ptr<scalar_t>(), z.data_ptr<scalar_t>() + c0 * Tt * np,
                   gates.data_ptr<scalar_t>() + c0 * Tt * Tt, gz.data_ptr<scalar_t>() + c0 * Tt * np,
                   c1 - c0, Tt, np, 0, (c1 - c0) * Tt);
    });
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
