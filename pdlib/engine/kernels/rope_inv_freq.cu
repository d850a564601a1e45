int i = thread_position_in_threadgroup.x;
if (i < HALF) { float d = (float)i / (float)HALF; out[i] = PD_EXP2(-d * lb[0]); }
