"""Running an experiment: one executor for the validation gate and the timed trials, and what drives it
(experiment set-up, the FP32 reference, trials, sweeps, the slo, overlap and disagg step sources)."""
