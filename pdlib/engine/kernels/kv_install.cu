    // one thread per float4 of the new keys (and values): (h, t, d4) over HKV x T x DH/4; T from the shape, so
    // one kernel serves every length
    const int T = k_shape[1];
    const size_t i = (size_t)threadgroup_position_in_grid.x * threads_per_threadgroup.x
                     + thread_position_in_threadgroup.x;
    if (i == 0) written[0] = after[0] + 1u;
    if (i >= (size_t)HKV * T * (DH / 4)) return;
    const int d4 = i % (DH / 4), t = (i / (DH / 4)) % T, h = i / ((size_t)(DH / 4) * T);
    const size_t slot = ((size_t)h * CAP + pos[0] + t) * (DH / 4) + d4;
    reinterpret_cast<PD_DEVICE_SPACE float4*>(const_cast<PD_DEVICE_SPACE float*>(kc))[slot] =
        reinterpret_cast<const PD_DEVICE_SPACE float4*>(k)[i];
    reinterpret_cast<PD_DEVICE_SPACE float4*>(const_cast<PD_DEVICE_SPACE float*>(vc))[slot] =
        reinterpret_cast<const PD_DEVICE_SPACE float4*>(v)[i];
