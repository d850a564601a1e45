"""Shared fixtures (the tiny synthetic model is built once per session), and which tests are slow.

`make test` runs everything; `make test-fast` (-m "not slow") leaves out what is listed in SLOW: papermill
notebook runs, bench-step runs, the kernel emulations with planted faults, NVRTC compiles, subprocess runs
that are killed or time out. Each takes over about a second on a two-core machine (pytest --durations).
"""

import pytest

from pdlib.weights import load_model

# test file (under tests/) -> the test functions in it that are slow, or "*" for every one
SLOW = {
    "publish/test_notebooks.py": "*",
    "tools/test_bench.py": "*",
    "engine/test_crosscheck_hf.py": "*",
    "publish/test_serve_notebook.py": ("test_notebooks_serve_renders_the_report_into_a_fresh_folder",),
    "publish/test_sweep.py": (
        "test_04_run_all_as_shipped_sweeps_the_smoke_experiment_into_a_fresh_local_folder",
        "test_04_renders_the_sweep_into_a_fresh_folder",
        "test_sweep_writes_one_report_per_point_and_the_index",
        "test_a_failing_point_stops_the_sweep_and_the_index_lists_completed_points",
    ),
    "analysis/test_render.py": (
        "test_render_draws_bench_steps_json_and_its_table",
        "test_a_bench_json_without_its_numbers_is_a_one_line_error",
    ),
    "test_no_traceback.py": (
        "test_a_params_file_runs_or_is_refused_in_one_line",
        "test_a_report_file_renders_or_is_refused_in_one_line",
    ),
    "engine/test_mailbox.py": (
        "test_bench_step_reads_the_persistent_kernels_tokens_from_the_mailbox_and_the_per_op_kernels_by_item",
        "test_the_pairs_mailbox_check_passes_the_kernels_contract_and_fails_each_fault",
        "test_the_mailbox_check_passes_the_kernels_contract_and_fails_each_fault",
    ),
    "engine/test_flash_attention.py": (
        "test_the_check_passes_the_emulation_and_fails_each_planted_fault",
        "test_the_cuda_sources_compile_for_the_h200",
    ),
    "engine/test_qk_rope.py": ("test_the_check_passes_the_twin_and_fails_each_planted_fault",),
    "engine/test_persistent_decode.py": ("test_the_cuda_source_compiles_for_the_h200",),
    "engine/test_kernel_sources.py": ("test_cuda_compiles_to_the_validated_ptx",),
    "engine/test_gemm.py": ("test_the_cuda_source_compiles_for_the_h200",),
    "run/test_disagg.py": (
        "test_a_worker_that_dies_or_hangs_mid_run_ends_it_cleanly",
        "test_a_parent_killed_mid_run_leaves_no_folder_and_no_worker",
    ),
    "report/test_presentation.py": (
        "test_ctrl_c_during_a_run_exits_130_and_writes_nothing",
        "test_presenting_a_report_loads_no_mlx",
        "test_ctrl_c_stops_a_long_mlx_computation_within_a_second_or_two",
    ),
    "run/test_executor.py": (
        "test_a_steps_cpu_time_is_the_host_threads_own",
        "test_a_step_records_when_the_host_had_issued_it_and_began_waiting",
    ),
    "run/test_overlap.py": ("test_the_issues_validate_command_passes_every_policy",),
    "run/test_serve.py": ("test_the_smoke_params_serve_every_policy_through_the_gate",),
    "publish/test_notebook_inputs.py": (
        "test_bare_papermill_refuses_in_one_line",
        "test_cli_prints_a_notebooks_refusal_in_one_line_exit_2",
        "test_ctrl_c_leaves_no_partial_run_no_traceback_no_kernel_files",
    ),
}


def pytest_collection_modifyitems(config, items):
    tests_dir = config.rootpath / "tests"
    for item in items:
        names = SLOW.get(item.path.relative_to(tests_dir).as_posix(), ())
        if names == "*" or item.originalname in names:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def tiny():
    return load_model("synthetic:tiny@0")
