    // one warp per (row t, head h) of the T x H heads (H = HQ + 2 HKV); lane l holds dims [4l, 4l + 4), so the
    // RoPE partner of lane l's dims (d +- DH/2) is in lane l ^ 16. T comes from the shape, not a template value:
    // a template value compiles one kernel per chunk length (about 1.4 s each on the H200, in a timed step)
    const int T = pos_shape[0];
    const size_t g = (size_t)threadgroup_position_in_grid.x * threads_per_threadgroup.x
                     + thread_position_in_threadgroup.x;
    if (g == 0) written[0] = after[0] + 1u;
    constexpr int H = HQ + 2 * HKV, HALF = DH / 2;
    const size_t w = g / 32;
    if (w >= (size_t)T * H) return;   // whole warps: the grid is a multiple of 32
    const int lane = PD_LANE(thread_position_in_threadgroup.x, thread_index_in_simdgroup);
    const int t = w / H, h = w % H, p = pos[t];
    float x[4];
    PD_UNROLL for (int i = 0; i < 4; ++i) x[i] = raw[w * DH + 4 * lane + i];
    if (h >= HQ + HKV) {   // v, stored as it came
        PD_DEVICE_SPACE float* dst = const_cast<PD_DEVICE_SPACE float*>(vc) + ((size_t)(h - HQ - HKV) * CAP + p) * DH;
        PD_UNROLL for (int i = 0; i < 4; ++i) dst[4 * lane + i] = x[i];
        return;
    }
    float s = x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3];
    for (int o = 16; o > 0; o >>= 1) s += PD_SHFL_XOR(s, o);
    const float r = PD_RSQRT(s / DH + PD_INT_AS_FLOAT(EPS_BITS));
    const PD_DEVICE_SPACE float* wn = h < HQ ? qn : kn;
    float y[4], other[4];
    PD_UNROLL for (int i = 0; i < 4; ++i) y[i] = x[i] * r * wn[4 * lane + i];
    PD_UNROLL for (int i = 0; i < 4; ++i) other[i] = PD_SHFL_XOR(y[i], 16);
    PD_DEVICE_SPACE float* dst = h < HQ ? q + ((size_t)h * T + t) * DH
        : const_cast<PD_DEVICE_SPACE float*>(kc) + ((size_t)(h - HQ) * CAP + p) * DH;
    PD_UNROLL for (int i = 0; i < 4; ++i) {
        const int d = 4 * lane + i, f = d < HALF ? d : d - HALF;
        const float theta = (float)p * inv_freq[f];
        const float cs = PD_COS(theta), sn = PD_SIN(theta);
        dst[d] = d < HALF ? y[i] * cs - other[i] * sn : other[i] * sn + y[i] * cs;
    }
