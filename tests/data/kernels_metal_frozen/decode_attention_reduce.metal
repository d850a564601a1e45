
    const int hq = threadgroup_position_in_grid.x, t = thread_position_in_threadgroup.x;
    const int live = min(NC, pos[0] / CHUNK + 1);
    float M = -INFINITY;
    for (int c = 0; c < live; ++c) M = fmax(M, part_m[hq * NC + c]);
    float Lsum = 0.f, O = 0.f;
    for (int c = 0; c < live; ++c) {
        const float mc = part_m[hq * NC + c];
        if (mc == -INFINITY) continue;
        const float f = metal::precise::exp(mc - M);
        Lsum += part_l[hq * NC + c] * f;
        O += part_o[((size_t)hq * NC + c) * DH + t] * f;
    }
    o[hq * DH + t] = O / Lsum;
