// Exact neighbourhood (sliding-window) attention on the CPU, fp32, forward and backward.
//
// Built by vit/kernels/neighborhood.py on the first CPU forward that runs it (plain C ABI, no torch headers) and
// called through ctypes.
// Layout: q, k, v, out and their gradients are (B, N, H, D) contiguous: N tokens, the first P of them prefix tokens.
// Patch query n (token P + n) attends to the K tokens nbr[n, :] (prefix tokens and its k x k neighbours); a prefix
// query attends to all N tokens. Every patch query sees exactly K keys, so the work is linear in N and no masked
// score is ever computed. The softmax probabilities are kept for the backward (B * H * (N - P) * K floats: K / D
// times q's size, 0.78 for k = 7, one prefix token and head_dim 64).
//
// Work is split into units (image b, head h): a unit reads and writes only its own head's slices, so units run in
// parallel without locks (the caller hands each thread a range of units).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

typedef float v8 __attribute__((vector_size(32)));

inline v8 load(const float* p) {
  v8 r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
inline void store(float* p, v8 x) { std::memcpy(p, &x, sizeof x); }
inline float hsum(v8 x) { return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7])); }

// head_dim = 8 V, held in registers: a dot product with four independent partial sums.
template <int V>
inline float dot(const v8* a, const float* b) {
  v8 s[4] = {};
#pragma GCC unroll 32
  for (int i = 0; i < V; ++i) s[i % 4] += a[i] * load(b + 8 * i);
  return hsum((s[0] + s[1]) + (s[2] + s[3]));
}

// Any head_dim: plain loops.
inline float dot(const float* a, const float* b, int64_t d) {
  float s = 0.f;
  for (int64_t i = 0; i < d; ++i) s += a[i] * b[i];
  return s;
}

struct Shape {
  int64_t N, H, D, P, K;
  float scale;
};

// Softmax of the scores in p[0..n) in place.
inline void softmax(float* p, int64_t n) {
  float m = -INFINITY, sum = 0.f;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, p[j]);
  for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(p[j] - m));
  const float inv = 1.f / sum;
  for (int64_t j = 0; j < n; ++j) p[j] *= inv;
}

// One query row of the forward: keys idx[0..n) (idx == nullptr: tokens 0..n), probabilities into p.
template <int V>
void forward_row(const float* qn, const float* kb, const float* vb, const int64_t* idx, int64_t n, const Shape& s,
                 float* p, float* on) {
  const int64_t T = s.H * s.D;
  if constexpr (V > 0) {
    v8 qv[V], acc[V];
#pragma GCC unroll 32
    for (int i = 0; i < V; ++i) {
      qv[i] = load(qn + 8 * i) * s.scale;
      acc[i] = v8{};
    }
    for (int64_t j = 0; j < n; ++j) p[j] = dot<V>(qv, kb + (idx ? idx[j] : j) * T);
    softmax(p, n);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = vb + (idx ? idx[j] : j) * T;
#pragma GCC unroll 32
      for (int i = 0; i < V; ++i) acc[i] += p[j] * load(vj + 8 * i);
    }
#pragma GCC unroll 32
    for (int i = 0; i < V; ++i) store(on + 8 * i, acc[i]);
  } else {
    for (int64_t j = 0; j < n; ++j) p[j] = s.scale * dot(qn, kb + (idx ? idx[j] : j) * T, s.D);
    softmax(p, n);
    std::fill(on, on + s.D, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const float* vj = vb + (idx ? idx[j] : j) * T;
      for (int64_t i = 0; i < s.D; ++i) on[i] += p[j] * vj[i];
    }
  }
}

// One query row of the backward: dS = P * (dO . V - dO . O); dq = scale dS K; dk += scale dS q; dv += P dO.
template <int V>
void backward_row(const float* qn, const float* kb, const float* vb, const int64_t* idx, int64_t n, const Shape& s,
                  const float* p, const float* on, const float* gn, float* dqn, float* dkb, float* dvb) {
  const int64_t T = s.H * s.D;
  if constexpr (V > 0) {
    v8 g[V], qs[V], acc[V];
#pragma GCC unroll 32
    for (int i = 0; i < V; ++i) {
      g[i] = load(gn + 8 * i);
      qs[i] = load(qn + 8 * i) * s.scale;
      acc[i] = v8{};
    }
    const float delta = dot<V>(g, on);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = (idx ? idx[j] : j) * T;
      const float pj = p[j], ds = pj * (dot<V>(g, vb + off) - delta);
      const float* kj = kb + off;
      float *dkj = dkb + off, *dvj = dvb + off;
#pragma GCC unroll 32
      for (int i = 0; i < V; ++i) {
        acc[i] += ds * load(kj + 8 * i);
        store(dkj + 8 * i, load(dkj + 8 * i) + ds * qs[i]);
        store(dvj + 8 * i, load(dvj + 8 * i) + pj * g[i]);
      }
    }
#pragma GCC unroll 32
    for (int i = 0; i < V; ++i) store(dqn + 8 * i, acc[i] * s.scale);
  } else {
    const float delta = dot(gn, on, s.D);
    std::fill(dqn, dqn + s.D, 0.f);
    for (int64_t j = 0; j < n; ++j) {
      const int64_t off = (idx ? idx[j] : j) * T;
      const float pj = p[j], ds = pj * (dot(gn, vb + off, s.D) - delta);
      for (int64_t i = 0; i < s.D; ++i) {
        dqn[i] += s.scale * ds * kb[off + i];
        dkb[off + i] += s.scale * ds * qn[i];
        dvb[off + i] += pj * gn[i];
      }
    }
  }
}

// Row n's keys (nullptr: all N tokens, for a prefix query), their number, and its probabilities in prob (patch
// queries, (B, H, N - P, K)) or prob_prefix (prefix queries, (B, H, P, N)).
inline const int64_t* row_keys(const int64_t* nbr, const Shape& s, int64_t n) {
  return n < s.P ? nullptr : nbr + (n - s.P) * s.K;
}
inline int64_t row_count(const Shape& s, int64_t n) { return n < s.P ? s.N : s.K; }
template <typename F>
inline F* row_probs(F* prob, F* prob_prefix, const Shape& s, int64_t b, int64_t h, int64_t n) {
  return n < s.P ? prob_prefix + ((b * s.H + h) * s.P + n) * s.N : prob + ((b * s.H + h) * (s.N - s.P) + n - s.P) * s.K;
}

template <int V>
void forward(const float* q, const float* k, const float* v, const int64_t* nbr, float* out, float* prob,
             float* prob_prefix, const Shape& s, int64_t begin, int64_t end) {
  const int64_t T = s.H * s.D;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t b = u / s.H, h = u % s.H, base = b * s.N * T + h * s.D;
    for (int64_t n = 0; n < s.N; ++n) {
      const int64_t row = base + n * T;
      forward_row<V>(q + row, k + base, v + base, row_keys(nbr, s, n), row_count(s, n), s,
                     row_probs(prob, prob_prefix, s, b, h, n), out + row);
    }
  }
}

template <int V>
void backward(const float* q, const float* k, const float* v, const int64_t* nbr, const float* out, const float* prob,
              const float* prob_prefix, const float* dout, float* dq, float* dk, float* dv, const Shape& s,
              int64_t begin, int64_t end) {
  const int64_t T = s.H * s.D;
  for (int64_t u = begin; u < end; ++u) {
    const int64_t b = u / s.H, h = u % s.H, base = b * s.N * T + h * s.D;
    for (int64_t n = 0; n < s.N; ++n) {
      const int64_t row = base + n * T;
      backward_row<V>(q + row, k + base, v + base, row_keys(nbr, s, n), row_count(s, n), s,
                      row_probs(prob, prob_prefix, s, b, h, n), out + row, dout + row, dq + row, dk + base, dv + base);
    }
  }
}

}  // namespace

#define VIT_DISPATCH(FN, ...)                   \
  switch (s.D) {                                \
    case 16: FN<2>(__VA_ARGS__); break;         \
    case 32: FN<4>(__VA_ARGS__); break;         \
    case 48: FN<6>(__VA_ARGS__); break;         \
    case 64: FN<8>(__VA_ARGS__); break;         \
    case 96: FN<12>(__VA_ARGS__); break;        \
    case 128: FN<16>(__VA_ARGS__); break;       \
    default: FN<0>(__VA_ARGS__); break;         \
  }

extern "C" {

// out (B, N, H, D); prob (B, H, N - P, K); prob_prefix (B, H, P, N). Units [begin, end) of B * H.
void vit_na_forward(const float* q, const float* k, const float* v, const int64_t* nbr, float* out, float* prob,
                    float* prob_prefix, int64_t N, int64_t H, int64_t D, int64_t P, int64_t K, float scale,
                    int64_t begin, int64_t end) {
  const Shape s{N, H, D, P, K, scale};
  VIT_DISPATCH(forward, q, k, v, nbr, out, prob, prob_prefix, s, begin, end)
}

// dq written; dk and dv accumulated (the caller zero-fills them).
void vit_na_backward(const float* q, const float* k, const float* v, const int64_t* nbr, const float* out,
                     const float* prob, const float* prob_prefix, const float* dout, float* dq, float* dk, float* dv,
                     int64_t N, int64_t H, int64_t D, int64_t P, int64_t K, float scale, int64_t begin, int64_t end) {
  const Shape s{N, H, D, P, K, scale};
  VIT_DISPATCH(backward, q, k, v, nbr, out, prob, prob_prefix, dout, dq, dk, dv, s, begin, end)
}

int vit_na_abi_version() { return 1; }
}
