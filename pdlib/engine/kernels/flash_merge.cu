    // one block of DH threads per (head, row) n: o = sum_z e^(m_z - M) o_z / sum_z e^(m_z - M) l_z, M = max_z m_z
    // (a split that saw no key of the row has m_z = -inf and weighs 0; the first split always sees key 0)
    const int NS = part_shape[0], DH = part_shape[3];
    const size_t HT = (size_t)part_shape[1] * part_shape[2], n = blockIdx.x, d = threadIdx.x;
    float M = -INFINITY;
    for (int zi = 0; zi < NS; ++zi) M = fmaxf(M, stats[2 * (zi * HT + n)]);
    float L = 0.f, acc = 0.f;
    for (int zi = 0; zi < NS; ++zi) {
        const float w = expf(stats[2 * (zi * HT + n)] - M);
        L += w * stats[2 * (zi * HT + n) + 1];
        acc += w * part[(zi * HT + n) * DH + d];
    }
    o[n * DH + d] = acc / L;
