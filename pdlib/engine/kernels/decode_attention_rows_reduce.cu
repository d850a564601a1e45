    // grid: R * HQ blocks of DH threads: block (row, hq) merges the live chunks (those at or before the row's
    // position, meta[3 row + 2]) of the row's head hq, as decode_attention_reduce.cu does for one row, into o
    // laid out (R, HQ, DH): o_proj's input rows as they lie, so no copy comes between.
    const int row = threadgroup_position_in_grid.x / HQ, hq = threadgroup_position_in_grid.x % HQ;
    const int t = thread_position_in_threadgroup.x, part = row * HQ + hq;
    const int live = min(NC, meta[3 * row + 2] / CHUNK + 1);
    float M = -INFINITY;
    for (int c = 0; c < live; ++c) M = PD_FMAX(M, part_m[part * NC + c]);
    float Lsum = 0.f, O = 0.f;
    for (int c = 0; c < live; ++c) {
        const float mc = part_m[part * NC + c];
        if (mc == -INFINITY) continue;
        const float f = PD_EXP(mc - M);
        Lsum += part_l[part * NC + c] * f;
        O += part_o[((size_t)part * NC + c) * DH + t] * f;
    }
    o[((size_t)row * HQ + hq) * DH + t] = O / Lsum;
