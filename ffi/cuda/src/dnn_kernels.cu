// kneepoint's small step kernels (compiled at run time with NVRTC): what a
// network plan needs besides cuDNN and cuBLAS. Every kernel is a grid-stride
// loop over its output; sizes are 64-bit; `act` is 0 identity, 1 relu,
// 2 clip to [lo, hi].

__device__ __forceinline__ float kp_apply(float v, int act, float lo, float hi) {
    if (act == 1) return fmaxf(v, 0.0f);
    if (act == 2) return fminf(fmaxf(v, lo), hi);
    return v;
}

#define KP_LOOP(i, total) \
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; \
         i < (total); i += (unsigned long long)gridDim.x * blockDim.x)

// y = act(y + bias[channel]) in place; bias may be null.
extern "C" __global__ void kp_bias_act(float* y, const float* bias, unsigned long long c,
                                       unsigned long long hw, unsigned long long total,
                                       int act, float lo, float hi) {
    KP_LOOP(i, total) {
        float v = y[i];
        if (bias) v += bias[(i / hw) % c];
        y[i] = kp_apply(v, act, lo, hi);
    }
}

// y = act(x * scale[channel] + shift[channel]).
extern "C" __global__ void kp_affine(const float* x, float* y, const float* scale,
                                     const float* shift, unsigned long long c,
                                     unsigned long long hw, unsigned long long total,
                                     int act, float lo, float hi) {
    KP_LOOP(i, total) {
        unsigned long long ch = (i / hw) % c;
        y[i] = kp_apply(x[i] * scale[ch] + shift[ch], act, lo, hi);
    }
}

// y = act(a + b); y may be a (in place).
extern "C" __global__ void kp_add(const float* a, const float* b, float* y,
                                  unsigned long long total, int act, float lo, float hi) {
    KP_LOOP(i, total) { y[i] = kp_apply(a[i] + b[i], act, lo, hi); }
}

// y = act(x).
extern "C" __global__ void kp_act(const float* x, float* y, unsigned long long total,
                                  int act, float lo, float hi) {
    KP_LOOP(i, total) { y[i] = kp_apply(x[i], act, lo, hi); }
}

// Each of `planes` h x w planes of x into an oh x ow plane of y at
// (top, left); the border filled with `fill`.
extern "C" __global__ void kp_pad(const float* x, float* y, unsigned long long planes,
                                  unsigned long long h, unsigned long long w,
                                  unsigned long long oh, unsigned long long ow,
                                  unsigned long long top, unsigned long long left, float fill) {
    KP_LOOP(i, planes * oh * ow) {
        unsigned long long p = i / (oh * ow), r = (i / ow) % oh, c = i % ow;
        long long ir = (long long)r - (long long)top, ic = (long long)c - (long long)left;
        y[i] = (ir >= 0 && ir < (long long)h && ic >= 0 && ic < (long long)w)
                   ? x[(p * h + ir) * w + ic]
                   : fill;
    }
}

// Average pooling with any (also asymmetric) padding, ONNX semantics.
extern "C" __global__ void kp_avgpool(const float* x, float* y, unsigned long long planes,
                                      unsigned long long h, unsigned long long w,
                                      unsigned long long oh, unsigned long long ow,
                                      unsigned long long kh, unsigned long long kw,
                                      unsigned long long sh, unsigned long long sw,
                                      unsigned long long pt, unsigned long long pl,
                                      unsigned long long pb, unsigned long long pr,
                                      int include_pad) {
    KP_LOOP(i, planes * oh * ow) {
        unsigned long long p = i / (oh * ow), oy = (i / ow) % oh, ox = i % ow;
        long long y0 = (long long)(oy * sh) - (long long)pt, y1 = y0 + (long long)kh;
        long long x0 = (long long)(ox * sw) - (long long)pl, x1 = x0 + (long long)kw;
        long long ya = y0 < 0 ? 0 : y0, yb = y1 > (long long)h ? (long long)h : y1;
        long long xa = x0 < 0 ? 0 : x0, xb = x1 > (long long)w ? (long long)w : x1;
        float sum = 0.0f;
        for (long long r = ya; r < yb; ++r)
            for (long long c = xa; c < xb; ++c) sum += x[(p * h + r) * w + c];
        float count;
        if (include_pad) {
            long long ey = (long long)(h + pb), ex = (long long)(w + pr);
            long long cy0 = y0 < -(long long)pt ? -(long long)pt : y0, cy1 = y1 > ey ? ey : y1;
            long long cx0 = x0 < -(long long)pl ? -(long long)pl : x0, cx1 = x1 > ex ? ex : x1;
            count = (float)((cy1 - cy0) * (cx1 - cx0));
        } else {
            count = (float)((yb - ya) * (xb - xa));
        }
        y[i] = sum / count;
    }
}

// Concatenation along channels: each sample's per_src values of x go to
// y at sample * per_dst + at.
extern "C" __global__ void kp_copy_block(const float* x, float* y, unsigned long long batch,
                                         unsigned long long per_src, unsigned long long per_dst,
                                         unsigned long long at) {
    KP_LOOP(i, batch * per_src) {
        unsigned long long n = i / per_src, j = i % per_src;
        y[n * per_dst + at + j] = x[i];
    }
}

// A permutation of the per-sample dimensions: output dimension d has
// out_shape[d] values and reads the input with stride in_stride[d].
struct kp_perm {
    unsigned int rank;
    unsigned int pad_;
    unsigned long long per;
    unsigned long long out_shape[8];
    unsigned long long in_stride[8];
};

extern "C" __global__ void kp_transpose(const float* x, float* y, unsigned long long batch,
                                        struct kp_perm p) {
    KP_LOOP(i, batch * p.per) {
        unsigned long long n = i / p.per, rem = i % p.per, src = 0;
        for (int d = (int)p.rank - 1; d >= 0; --d) {
            src += (rem % p.out_shape[d]) * p.in_stride[d];
            rem /= p.out_shape[d];
        }
        y[i] = x[n * p.per + src];
    }
}
