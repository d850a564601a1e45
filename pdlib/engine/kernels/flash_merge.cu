    // one block of DH threads per (head, row) n: o = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z, M = max_z m_z
    // (a split that saw no key of the row has m_z = -inf and weighs 0; the first split always sees key 0). o is
    // (rows, heads, DH), as o_proj reads it: MLX would otherwise copy it there
    const int NS = part_shape[0], HQ = part_shape[1], T = part_shape[2], DH = part_shape[3];
    const size_t HT = (size_t)HQ * T, n = blockIdx.x, d = threadIdx.x;
    float M = -INFINITY;
    for (int zi = 0; zi < NS; ++zi) M = fmaxf(M, stats[2 * (zi * HT + n)]);
    float L = 0.f, acc = 0.f;
    for (int zi = 0; zi < NS; ++zi) {
        const float w = expf(stats[2 * (zi * HT + n)] - M);
        L += w * stats[2 * (zi * HT + n) + 1];
        acc += w * part[(zi * HT + n) * DH + d];
    }
    o[((n % T) * HQ + n / T) * DH + d] = acc / L;
