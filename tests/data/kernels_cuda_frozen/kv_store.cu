
    // one thread per float4 of keys (and of values): (h, s, d4) over HKV x S x DH/4, S = start + T
    const int T = k_shape[1], start = pos[0], S = start + T;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) written[0] = after[0] + 1u;
    if (i >= (size_t)HKV * S * (DH / 4)) return;
    const int d4 = i % (DH / 4), s = (i / (DH / 4)) % S, h = i / ((size_t)(DH / 4) * S);
    const size_t slot = ((size_t)h * CAP + s) * (DH / 4) + d4;
    float4* K4 = reinterpret_cast<float4*>(const_cast<float*>(kc));
    float4* V4 = reinterpret_cast<float4*>(const_cast<float*>(vc));
    float4 kv, vv;
    if (s < start) { kv = K4[slot]; vv = V4[slot]; }
    else {
        const size_t src = ((size_t)h * T + (s - start)) * (DH / 4) + d4;
        kv = reinterpret_cast<const float4*>(k)[src]; vv = reinterpret_cast<const float4*>(v)[src];
        K4[slot] = kv; V4[slot] = vv;
    }
    reinterpret_cast<float4*>(keys)[i] = kv;
    reinterpret_cast<float4*>(values)[i] = vv;
