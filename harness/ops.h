// The GPT's layer kernels, forward and backward, written out by hand (llm.c's
// layout: activations are row-major [N = B*T rows, channels]). Templated on
// the scalar type so the gradient check can run the very same code in double.
//
// Conventions: every backward kernel *accumulates* (+=) into its gradient
// outputs; callers zero them. Loops are ordered so the innermost loop is a
// contiguous axpy, which compilers vectorise without -ffast-math and which
// sums in a fixed order (results are reproducible run to run).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

namespace loom::harness {

// out[N, OC] = inp[N, IC] @ w[OC, IC]^T (+ bias[OC]).
template <typename F>
void matmul_forward(F* out, const F* inp, const F* w, const F* bias, int n, int ic, int oc) {
  // w transposed once so the inner loop is an axpy over the output row.
  thread_local std::vector<F> wt;
  wt.resize(static_cast<size_t>(ic) * oc);
  for (int o = 0; o < oc; ++o)
    for (int i = 0; i < ic; ++i) wt[static_cast<size_t>(i) * oc + o] = w[static_cast<size_t>(o) * ic + i];
  for (int r = 0; r < n; ++r) {
    F* y = out + static_cast<size_t>(r) * oc;
    const F* x = inp + static_cast<size_t>(r) * ic;
    for (int o = 0; o < oc; ++o) y[o] = bias ? bias[o] : F(0);
    for (int i = 0; i < ic; ++i) {
      const F xi = x[i];
      const F* wrow = wt.data() + static_cast<size_t>(i) * oc;
      for (int o = 0; o < oc; ++o) y[o] += xi * wrow[o];
    }
  }
}

// dinp += dout @ w; dw += dout^T @ inp; dbias += column sums of dout.
// Any of dinp / dbias may be null.
template <typename F>
void matmul_backward(F* dinp, F* dw, F* dbias, const F* dout, const F* inp, const F* w, int n,
                     int ic, int oc) {
  for (int r = 0; r < n; ++r) {
    const F* dy = dout + static_cast<size_t>(r) * oc;
    const F* x = inp + static_cast<size_t>(r) * ic;
    F* dx = dinp ? dinp + static_cast<size_t>(r) * ic : nullptr;
    for (int o = 0; o < oc; ++o) {
      const F g = dy[o];
      const F* wrow = w + static_cast<size_t>(o) * ic;
      F* dwrow = dw + static_cast<size_t>(o) * ic;
      if (dx)
        for (int i = 0; i < ic; ++i) dx[i] += g * wrow[i];
      for (int i = 0; i < ic; ++i) dwrow[i] += g * x[i];
    }
    if (dbias)
      for (int o = 0; o < oc; ++o) dbias[o] += dy[o];
  }
}

// out[r, c] = wte[tok[r], c] + wpe[pos0 + r % t, c]
template <typename F>
void encoder_forward(F* out, const int* tok, const F* wte, const F* wpe, int n, int t, int c,
                     int pos0 = 0) {
  for (int r = 0; r < n; ++r) {
    const F* e = wte + static_cast<size_t>(tok[r]) * c;
    const F* p = wpe + static_cast<size_t>(pos0 + r % t) * c;
    F* y = out + static_cast<size_t>(r) * c;
    for (int i = 0; i < c; ++i) y[i] = e[i] + p[i];
  }
}

template <typename F>
void encoder_backward(F* dwte, F* dwpe, const F* dout, const int* tok, int n, int t, int c) {
  for (int r = 0; r < n; ++r) {
    const F* g = dout + static_cast<size_t>(r) * c;
    F* de = dwte + static_cast<size_t>(tok[r]) * c;
    F* dp = dwpe + static_cast<size_t>(r % t) * c;
    for (int i = 0; i < c; ++i) {
      de[i] += g[i];
      dp[i] += g[i];
    }
  }
}

inline constexpr double kLayerNormEps = 1e-5;

template <typename F>
void layernorm_forward(F* out, F* mean, F* rstd, const F* inp, const F* w, const F* b, int n, int c) {
  for (int r = 0; r < n; ++r) {
    const F* x = inp + static_cast<size_t>(r) * c;
    F m = 0;
    for (int i = 0; i < c; ++i) m += x[i];
    m /= c;
    F v = 0;
    for (int i = 0; i < c; ++i) v += (x[i] - m) * (x[i] - m);
    v /= c;
    const F s = F(1) / std::sqrt(v + F(kLayerNormEps));
    F* y = out + static_cast<size_t>(r) * c;
    for (int i = 0; i < c; ++i) y[i] = (x[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

template <typename F>
void layernorm_backward(F* dinp, F* dw, F* db, const F* dout, const F* inp, const F* w,
                        const F* mean, const F* rstd, int n, int c) {
  for (int r = 0; r < n; ++r) {
    const F* dy = dout + static_cast<size_t>(r) * c;
    const F* x = inp + static_cast<size_t>(r) * c;
    F* dx = dinp + static_cast<size_t>(r) * c;
    const F m = mean[r], s = rstd[r];
    // Two reductions of the normalised-input gradient (see the LayerNorm derivation).
    F dnorm_mean = 0, dnorm_norm_mean = 0;
    for (int i = 0; i < c; ++i) {
      const F norm = (x[i] - m) * s;
      const F dnorm = w[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= c;
    dnorm_norm_mean /= c;
    for (int i = 0; i < c; ++i) {
      const F norm = (x[i] - m) * s;
      const F dnorm = w[i] * dy[i];
      db[i] += dy[i];
      dw[i] += norm * dy[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

// Causal self-attention over `nh` heads of size hs for b sequences of length t.
// qkv: [b*t, 3*nh*hs] laid out as [q heads | k heads | v heads];
// out: [b*t, nh*hs]; att: softmax probabilities [b, nh, t, t] (kept for backward).
template <typename F>
void attention_forward(F* out, F* att, const F* qkv, int b, int t, int nh, int hs) {
  const int cl = nh * hs, c3 = 3 * cl;
  const F scale = F(1) / std::sqrt(F(hs));
  for (int bi = 0; bi < b; ++bi)
    for (int h = 0; h < nh; ++h)
      for (int i = 0; i < t; ++i) {
        const F* q = qkv + static_cast<size_t>(bi * t + i) * c3 + h * hs;
        F* a = att + ((static_cast<size_t>(bi) * nh + h) * t + i) * t;
        F mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const F* k = qkv + static_cast<size_t>(bi * t + j) * c3 + cl + h * hs;
          F dot = 0;
          for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
          a[j] = dot * scale;
          mx = std::max(mx, a[j]);
        }
        F sum = 0;
        for (int j = 0; j <= i; ++j) {
          a[j] = std::exp(a[j] - mx);
          sum += a[j];
        }
        for (int j = 0; j <= i; ++j) a[j] /= sum;
        for (int j = i + 1; j < t; ++j) a[j] = 0;
        F* y = out + static_cast<size_t>(bi * t + i) * cl + h * hs;
        for (int d = 0; d < hs; ++d) y[d] = 0;
        for (int j = 0; j <= i; ++j) {
          const F* v = qkv + static_cast<size_t>(bi * t + j) * c3 + 2 * cl + h * hs;
          for (int d = 0; d < hs; ++d) y[d] += a[j] * v[d];
        }
      }
}

template <typename F>
void attention_backward(F* dqkv, const F* dout, const F* qkv, const F* att, int b, int t, int nh,
                        int hs) {
  const int cl = nh * hs, c3 = 3 * cl;
  const F scale = F(1) / std::sqrt(F(hs));
  std::vector<F> datt(static_cast<size_t>(t));
  for (int bi = 0; bi < b; ++bi)
    for (int h = 0; h < nh; ++h)
      for (int i = 0; i < t; ++i) {
        const F* a = att + ((static_cast<size_t>(bi) * nh + h) * t + i) * t;
        const F* dy = dout + static_cast<size_t>(bi * t + i) * cl + h * hs;
        // out = sum_j a_j v_j
        for (int j = 0; j <= i; ++j) {
          const F* v = qkv + static_cast<size_t>(bi * t + j) * c3 + 2 * cl + h * hs;
          F* dv = dqkv + static_cast<size_t>(bi * t + j) * c3 + 2 * cl + h * hs;
          F d = 0;
          for (int e = 0; e < hs; ++e) {
            d += dy[e] * v[e];
            dv[e] += a[j] * dy[e];
          }
          datt[j] = d;
        }
        // softmax backward: dpre_j = a_j (datt_j - sum_k a_k datt_k)
        F dot = 0;
        for (int j = 0; j <= i; ++j) dot += a[j] * datt[j];
        const F* q = qkv + static_cast<size_t>(bi * t + i) * c3 + h * hs;
        F* dq = dqkv + static_cast<size_t>(bi * t + i) * c3 + h * hs;
        for (int j = 0; j <= i; ++j) {
          const F dpre = a[j] * (datt[j] - dot) * scale;
          const F* k = qkv + static_cast<size_t>(bi * t + j) * c3 + cl + h * hs;
          F* dk = dqkv + static_cast<size_t>(bi * t + j) * c3 + cl + h * hs;
          for (int e = 0; e < hs; ++e) {
            dq[e] += dpre * k[e];
            dk[e] += dpre * q[e];
          }
        }
      }
}

// GELU, tanh approximation (GPT-2's).
template <typename F>
void gelu_forward(F* out, const F* inp, size_t n) {
  const F k = std::sqrt(F(2) / F(M_PI));
  for (size_t i = 0; i < n; ++i) {
    const F x = inp[i];
    out[i] = F(0.5) * x * (F(1) + std::tanh(k * (x + F(0.044715) * x * x * x)));
  }
}

template <typename F>
void gelu_backward(F* dinp, const F* inp, const F* dout, size_t n) {
  const F k = std::sqrt(F(2) / F(M_PI));
  for (size_t i = 0; i < n; ++i) {
    const F x = inp[i];
    const F u = k * (x + F(0.044715) * x * x * x);
    const F th = std::tanh(u);
    const F sech2 = F(1) - th * th;
    const F grad = F(0.5) * (F(1) + th) + F(0.5) * x * sech2 * k * (F(1) + F(3) * F(0.044715) * x * x);
    dinp[i] += grad * dout[i];
  }
}

// probs[r] = softmax(logits[r]); returns sum over rows of -log probs[r][target[r]].
template <typename F>
double softmax_crossentropy_forward(F* probs, const F* logits, const int* target, int n, int v) {
  double loss = 0;
  for (int r = 0; r < n; ++r) {
    const F* z = logits + static_cast<size_t>(r) * v;
    F* p = probs + static_cast<size_t>(r) * v;
    F mx = z[0];
    for (int i = 1; i < v; ++i) mx = std::max(mx, z[i]);
    F sum = 0;
    for (int i = 0; i < v; ++i) {
      p[i] = std::exp(z[i] - mx);
      sum += p[i];
    }
    for (int i = 0; i < v; ++i) p[i] /= sum;
    // log p computed from the logits, not log(p[i]), so a tiny p does not underflow.
    loss -= static_cast<double>(z[target[r]] - mx - std::log(sum));
  }
  return loss;
}

// dlogits = (probs - onehot(target)) * scale, written (not accumulated).
template <typename F>
void softmax_crossentropy_backward(F* dlogits, const F* probs, const int* target, int n, int v,
                                   F scale) {
  for (int r = 0; r < n; ++r) {
    const F* p = probs + static_cast<size_t>(r) * v;
    F* d = dlogits + static_cast<size_t>(r) * v;
    for (int i = 0; i < v; ++i) d[i] = p[i] * scale;
    d[target[r]] -= scale;
  }
}

}  // namespace loom::harness
