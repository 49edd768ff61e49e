"""The protocol tests can fail: under a mutant whose workers never take anything from communication,
every multi-process protocol test must fail on one of its own assertions (slow set).

The mutant (tests/mutants/catalog.py) keeps every message flowing, so a test cannot "fail" by
hanging or by a worker error: each must fail because its assertion on mixing, consensus or
the averaged gradient does not hold.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from catalog import ENV, MUTANTS

ROOT = Path(__file__).resolve().parents[2]
MUTANT_SITE = str(Path(__file__).resolve().parent / "site")
# every test of a protocol's mixing; the failure-handling tests there (a stalled or dead worker fails
# the job) are about errors, not mixing, and pass under the mutant as they should
PROTOCOL_TESTS = [
    "tests/runtime/test_protocols_mp.py::test_ring_average_known_answer",
    "tests/runtime/test_protocols_mp.py::test_averaging_preserves_the_mean_and_contracts_before_finish",
    "tests/runtime/test_protocols_mp.py::test_hop_straggler_skips_and_fast_workers_do_not_wait_for_it",
    "tests/runtime/test_protocols_mp.py::test_allreduce_is_ddp_and_workers_agree_to_stop",
    "tests/runtime/test_group_protocols.py",
    "tests/jobs/test_respawn.py::test_a_replacement_joins_reaches_the_others_and_ends_in_consensus",
    "tests/integrations/test_lightning_conformance.py::test_hop_schedulers_fractional_validation_accumulation_test_and_predict",
    "tests/jobs/test_final_model.py::test_one_worker_evaluates_the_final_model_that_every_worker_holds",
    "tests/runtime/test_thread_tier.py",  # the fast tier: thread-ranks in the test process (the mutant applies there)
]


def _run_under_mutant(tmp_path: Path, mutant: str | None) -> dict[str, str | None]:
    """Run PROTOCOL_TESTS in a child pytest; {test id: None if it passed, else its failure message}."""
    report = tmp_path / f"report-{mutant}.xml"
    env = dict(os.environ)
    env.pop(ENV, None)
    if mutant:
        env[ENV] = mutant  # every process of the child run applies it (tests/mutants/site/sitecustomize.py)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (MUTANT_SITE, env.get("PYTHONPATH")) if p)
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "", "-q",
                    f"--junitxml={report}", *PROTOCOL_TESTS], cwd=ROOT, env=env, capture_output=True, text=True,
                   timeout=900)
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        failed = case.find("failure")
        errored = case.find("error")
        skipped = case.find("skipped")
        if skipped is not None:
            continue
        problem = failed if failed is not None else errored
        outcomes[name] = None if problem is None else (problem.get("message") or "")
    return outcomes


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_every_protocol_test_fails_when_workers_never_communicate(processes, tmp_path):
    mutated = _run_under_mutant(tmp_path, "no-comm")
    assert len(mutated) >= 39, sorted(mutated)  # 6 of test_protocols_mp (with parameters), 12 group, 5 respawn,
    # 1 Lightning, 2 of the final model, 13 of the thread tier
    passed = [name for name, message in mutated.items() if message is None]
    assert not passed, f"these pass with no communication at all, so they test none: {passed}"
    not_assertions = {name: message[:200] for name, message in mutated.items()
                      if not message.startswith(("AssertionError", "assert"))}
    assert not not_assertions, f"these failed for another reason than their assertions: {not_assertions}"


# ----- the communication features (issue 36): each mutant removes one, and these tests must see it -------
OC = "tests/runtime/test_outer_consensus.py"
PT = "tests/planner/test_plan_train.py"  # training with a plan (issue 42)
PTC = "tests/planner/test_plan_train_check.py"  # its checks of training (issue 68)
RS = "tests/jobs/test_resume_state.py"
FT = "tests/runtime/test_fake_transport.py"  # each protocol shell's wiring on the fake transport
DR = "tests/test_docs_records.py"
ED = "tests/test_epoch_deal.py"  # each epoch's batches dealt out over the members (issue 71)
EM = "tests/jobs/test_elastic_membership.py"  # workers that join and leave a running job (issue 71)
ADV = "tests/advisor/test_time_to_target_and_spikes.py"  # advise: time to target, transient slowdowns (issue 72)
RE = "tests/ray/test_ray_elastic.py"  # a Ray job grows onto an added node and leaves a drained one (issue 71)
COMM_MUTANTS = {
    "pair-links-one-lock": [
        "tests/transport/test_pair_links.py::test_a_pair_waiting_for_its_peer_does_not_hold_up_the_link_to_another_peer"],
    "speed-basis-counts-the-start": [
        "tests/jobs/test_emulation.py::test_the_speed_basis_leaves_out_the_start_s_phases_a_collective_lengthened"],
    "ray-joins-only-on-schedule": [
        f"{RE}::test_a_ray_job_that_grew_ends_with_every_member_holding_one_model",
        f"{RE}::test_a_ray_job_grows_onto_an_added_node_its_workers_leave_when_it_is_drained_and_it_grows_back"],
    "ray-joins-together": [f"{RE}::test_a_ray_job_that_grew_ends_with_every_member_holding_one_model"],
    "ray-drains-unseen": [
        f"{RE}::test_a_ray_job_grows_onto_an_added_node_its_workers_leave_when_it_is_drained_and_it_grows_back"],
    "ray-workers-niced": ["tests/ray/test_ray_launcher.py::test_a_hop_job_on_ray_actors_trains_and_writes_its_record"],
    "ray-left-rank-keeps-no-room": [
        f"{RE}::test_a_ray_job_grows_onto_an_added_node_its_workers_leave_when_it_is_drained_and_it_grows_back"],
    "ray-growth-unchecked": [
        f"{RE}::test_a_ray_job_asked_to_shrink_below_its_start_is_refused_before_the_cluster_is_joined"],
    "vacant-ranks-not-held-dead": [
        f"{EM}::test_a_job_grows_into_its_vacant_ranks_and_every_member_ends_with_the_final_model[hop-until0]"],
    "joins-never-start": [
        f"{EM}::test_a_job_grows_into_its_vacant_ranks_and_every_member_ends_with_the_final_model[hop-until0]"],
    "worker-sigterm-ignored": [
        f"{EM}::test_sigterm_to_one_worker_is_a_leave_not_a_death_even_where_a_death_aborts_the_job[hop]",
        f"{RE}::test_sigterm_to_a_ray_workers_process_is_a_leave_not_a_death"],
    "leave-without-grace": [
        "tests/jobs/test_members.py::test_a_leave_is_granted_only_after_the_grace_and_is_recorded_once"],
    "deal-own-counter": [f"{ED}::test_workers_at_different_speeds_that_join_and_leave_take_each_sample_once_per_epoch",
                         f"{EM}::test_a_job_grows_into_its_vacant_ranks_and_every_member_ends_with_the_final_model[hop-until0]"],
    "ps-joiner-counted-from-zero": [
        "tests/protocols/test_pure_layer.py::"
        "test_a_worker_that_joins_is_waited_for_from_its_next_push_and_counted_as_far_as_the_slowest"],
    "ps-joiners-unserved": [
        f"{EM}::test_a_job_grows_into_its_vacant_ranks_and_every_member_ends_with_the_final_model[ps-until4]"],
    "left-rank-stays-gone": [
        "tests/jobs/test_members.py::test_joins_beyond_the_vacant_ranks_wait_and_take_the_rank_of_a_worker_that_left",
        f"{EM}::test_a_rank_a_worker_left_is_joined_again_by_a_join_that_waited_for_it"],
    "deal-joiner-from-epoch-zero": [
        f"{ED}::test_workers_at_different_speeds_that_join_and_leave_take_each_sample_once_per_epoch"],
    "deal-order-per-worker": [
        f"{ED}::test_workers_at_different_speeds_that_join_and_leave_take_each_sample_once_per_epoch"],
    "rate-board-waits-for-every-rank": [
        "tests/test_data_split.py::test_a_rank_with_no_worker_yet_reads_zero_and_counts_once_a_worker_joins_into_it"],
    "leaver-joins-the-final-average": [
        f"{EM}::test_sync_leave_lets_a_worker_of_a_users_loop_go_and_the_others_average_without_it"],
    "advise-ranks-first-candidate": [
        "tests/advisor/test_ranking.py::test_a_profile_with_one_5x_slow_worker_does_not_recommend_allreduce"],
    "advise-profile-from-flags": [
        "tests/advisor/test_ranking.py::test_the_profile_is_what_the_run_measured_not_what_the_flags_said",
        "tests/advisor/test_advise_cli.py::test_advise_measures_simulates_and_recommends_a_command_that_parses"],
    "advise-ranks-by-speed-only": [f"{ADV}::test_the_ranking_puts_the_soonest_to_target_first_not_the_fastest"],
    "advise-no-time-to-target": [f"{ADV}::test_advice_predicts_time_to_target_and_allreduce_behind_a_5x_worker_is_later"],
    "sim-stop-at-target-ignored": [
        "tests/sim/test_stop_at_target.py::test_a_run_told_to_stop_at_the_target_ends_there_and_one_not_told_runs_its_budget"],
    "advise-slow-link-counted-twice": [
        f"{ADV}::test_the_measured_all_reduce_on_slow_emulated_links_is_not_charged_twice"],
    "advise-one-seed": [f"{ADV}::test_advice_predicts_time_to_target_and_allreduce_behind_a_5x_worker_is_later"],
    "sim-math-momentum-ignored": [f"{ADV}::test_the_model_math_takes_momentum_as_torch_sgd_does"],
    "ledger-spikes-not-counted": [f"{ADV}::test_the_ledger_counts_transient_slowdowns_after_the_start"],
    "advise-spikes-not-simulated": [
        f"{ADV}::test_measured_spikes_are_simulated_as_a_trace_drawn_from_their_distribution",
        f"{ADV}::test_transient_stragglers_slow_allreduce_in_the_prediction_and_are_taken_out_of_its_measured_cost"],
    "advise-collective-includes-spike-waits": [
        f"{ADV}::test_transient_stragglers_slow_allreduce_in_the_prediction_and_are_taken_out_of_its_measured_cost"],
    "hop-update-to-first-out-neighbour-only": [
        f"{FT}::test_hop_sends_each_iteration_s_model_to_every_out_neighbour_and_a_token_back_to_every_in_neighbour"],
    "hop-graph-not-repaired": [
        f"{FT}::test_a_death_on_the_ring_is_repaired_and_the_survivors_send_over_the_new_edges_only"],
    "keyframes-always": [f"{FT}::test_compressed_hop_sends_a_keyframe_first_then_deltas_a_fraction_of_its_size"],
    "ps-answers-the-first-worker": [
        f"{FT}::test_the_parameter_server_answers_each_push_to_the_worker_that_pushed_and_no_other"],
    "calibration-sticks": [
        "tests/jobs/test_emulation.py::test_a_busy_start_does_not_stick_each_quick_iteration_still_lasts_its_target"],
    "standalone-ignores-achieved": [
        "tests/jobs/test_emulation.py::test_the_emulated_standalone_iteration_is_never_shorter_than_the_achieved_phase"],
    "ddp-wait-as-work": [
        "tests/jobs/test_emulation_record.py::test_the_record_gives_each_worker_s_compute_phase_against_its_target"
        "[allreduce]"],
    "unauthenticated-peer-accepted": [
        "tests/jobs/test_hostile_peer.py::test_a_stranger_on_a_local_jobs_group_generator_gets_nothing_in",
        "tests/ray/test_store_strangers.py::test_a_strangers_pickles_garbage_and_forgeries_are_dropped_and_run_nothing"],
    "outer-step-on-own-anchor": [
        f"{OC}::test_outer_nesterov_without_progress_is_plain_gossip_off_the_complete_graph[exponential]",
        f"{OC}::test_outer_nesterov_without_progress_is_plain_gossip_off_the_complete_graph[torus]"],
    "anchors-kept-local": [f"{OC}::test_outer_nesterov_without_progress_is_plain_gossip_off_the_complete_graph[prague]"],
    "anchor-at-build": [f"{OC}::test_weights_loaded_into_a_wrapped_model_are_the_anchor_not_progress"],
    "rows-by-steps": [f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[ring]",
                      f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[torus]",
                      "tests/comm/test_specs.py::test_steps_weighted_mixing_keeps_the_steps_weighted_mean_on_symmetric_graphs",
                      "tests/comm/test_specs.py::test_local_steps_follow_speed"],
    "no-steps-weighting": [f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[ring]",
                           f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[torus]"],
    "preduce-unweighted": [f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[prague]"],
    "no-circulation-weighting": [f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[exponential]"],
    "circulation-by-own-steps": [f"{OC}::test_auto_local_work_gossip_converges_to_the_steps_weighted_mean[exponential]"],
    "ps-final-from-server": [f"{OC}::test_every_protocol_ends_with_the_last_outer_step_and_the_steps_after_it[ps]"],
    "outer-step-without-exchange": [f"{OC}::test_an_adpsgd_sync_that_averages_nothing_takes_no_outer_step"],
    "fingerprint-without-comm": [
        "tests/jobs/test_failures.py::test_resume_refuses_another_configuration_and_a_corrupt_checkpoint"],
    "powersgd-cold-resume": [RS + "::test_all_reduce_s_powersgd_resumes_with_its_warm_start_and_each_worker_s_own_residual"],
    "own-state-from-rank-0": [RS + "::test_all_reduce_s_powersgd_resumes_with_its_warm_start_and_each_worker_s_own_residual"],
    "resume-with-nothing-left": ["tests/jobs/test_failures.py::test_resume_with_no_iterations_left_is_refused_in_one_line"],
    "restart-after-the-end-refused": [
        "tests/jobs/test_torchrun_failures.py::test_a_torchrun_restart_after_the_last_checkpoint_finishes_the_job"],
    "deaths-on-the-raw-clock": ["tests/jobs/test_death_records.py::test_a_death_s_wall_s_counts_from_the_job_s_start",
                                "tests/jobs/test_failures.py::test_survivors_go_on_when_a_worker_is_killed_mid_training[hop-options0]"],
    "topology-by-its-path": ["tests/jobs/test_resume_refusals.py::test_an_edge_file_counts_by_its_content_not_its_path"],
    "refusal-as-a-dump": ["tests/jobs/test_resume_refusals.py::test_every_refusal_is_one_line_naming_the_flag_that_differs"],
    "rewound-epoch-claimed-again": [
        "tests/integrations/test_shared_batches.py::test_an_epoch_rewound_mid_run_is_a_full_pass_again_on_every_rank",
        "tests/integrations/test_accelerate_reload.py::test_a_state_loaded_inside_the_block_rewinds_the_shared_epoch_to_a_full_pass[hop]"],
    "mid-fit-load-deferred": [
        "tests/integrations/test_lightning_mid_fit_load.py::test_a_checkpoint_loaded_during_a_fit_reaches_the_running_protocol"],
    "any-torchrun-attempt-finishes": [
        "tests/jobs/test_torchrun_restart.py::test_only_an_attempt_of_the_torchrun_job_that_trained_there_reads_as_its_restart"],
    "free-collectives": [
        "tests/runtime/test_comm_protocols.py::test_a_group_average_holds_its_members_for_its_bytes_over_the_link"],
    "ingress-in-arrival-order": [
        "tests/transport/test_link_clock.py::test_a_message_booked_after_one_sent_behind_it_keeps_its_own_time"],
    "free-gg-requests": ["tests/runtime/test_comm_protocols.py::test_the_group_generators_round_trip_pays_the_link_latency"],
    "no-shared-start": [
        "tests/runtime/test_comm_protocols.py::test_neighbours_that_start_from_one_model_skip_the_first_keyframe"],
    "stale-replicas-across-edges": [
        "tests/runtime/test_compressed_membership.py",
        "tests/compression/test_codecs.py::test_a_holder_a_delta_skips_gets_a_keyframe_next_and_copies_never_drift"],
    "topk-random-indices": ["tests/compression/test_codecs.py::test_topk_keeps_exactly_the_largest_values_and_nothing_else"],
    "admitted-before-start": [
        "tests/jobs/test_replacement_at_the_end.py::test_no_replacement_joins_before_every_original_is_ready"],
    "ready-only-at-the-barrier": ["tests/runtime/test_compressed_membership.py"],
    "data-split-ignored": [
        "tests/test_data_split.py::test_a_shard_is_its_slice_and_the_whole_split_reaches_every_sample_with_each_workers_own_seed",
        "tests/test_data_split.py::test_the_lm_text_is_split_the_same_way"],
    "balance-ignored": [
        "tests/test_data_split.py::test_a_fast_worker_draws_the_slow_workers_shard_in_the_share_the_mix_gives",
        "tests/test_data_split.py::test_a_straggler_s_shard_is_trained_by_the_fast_workers_in_a_real_run"],
    "no-dead-band": [
        "tests/test_data_split.py::test_at_nearly_equal_speeds_each_worker_keeps_to_its_shard_exactly_as_shard_does"],
    "momentum-unmixed": [f"{OC}::test_the_outer_momentum_is_mixed_as_the_models_are"],
    "late-updates-as-models": [  # issue 37: Hop's old updates with their lost steps put back
        "tests/runtime/test_hop_late_updates.py::test_old_updates_have_their_lost_steps_put_back"],
    "progress-with-the-mixing": [  # the dropped rule: P measured from the last send, mixing included
        "tests/runtime/test_hop_late_updates.py::test_old_updates_have_their_lost_steps_put_back"],
    "loaded-weights-as-progress": [  # weights loaded mid-run are not the worker's own steps
        "tests/runtime/test_hop_late_updates.py::test_weights_loaded_midway_are_not_counted_as_steps"],
    "reanchor-outer-only": ["tests/runtime/test_hop_late_updates.py::test_weights_loaded_midway_are_not_counted_as_steps"],
    "momentum-unbound-after-load": [
        f"{OC}::test_a_loaded_outer_optimizer_keeps_its_momentum_in_the_buffers_the_protocol_mixes"],
    "momentum-bound-only-at-the-step": [
        f"{OC}::test_a_loaded_outer_optimizer_keeps_its_momentum_in_the_buffers_the_protocol_mixes"],
    "sign-scaled-by-the-largest": ["tests/compression/test_codecs.py::"
                                   "test_a_model_beside_its_momentum_goes_in_its_own_code_and_the_momentum_one_bit_a_value"],
    "sign-bits-reversed": ["tests/compression/test_codecs.py::"
                           "test_the_one_bit_code_returns_every_sign_and_each_block_s_mean_magnitude"],
    "topk-sample-trusted": ["tests/compression/test_codecs.py::"
                            "test_topk_keeps_exactly_the_largest_values_of_a_large_vector[every-third]"],
    "compressed-preduce-unweighted": ["tests/compression/test_preduce_compressed.py::"
                                      "test_uncompressed_members_move_to_the_weighted_mean_by_the_step"],
    "quantized-in-the-input": ["tests/compression/test_codecs.py::test_encoding_leaves_its_input_as_it_was[int8]"],
    "topk-ties-as-topk-likes": ["tests/compression/test_codecs.py::"
                                "test_topk_breaks_ties_at_the_kth_magnitude_by_the_lowest_index"],
    "topk-nan-below-threshold": ["tests/compression/test_codecs.py::test_topk_sends_a_nan_the_sample_did_not_see"],
    "sparse-topk-zeros-from-the-end": ["tests/compression/test_codecs.py::test_topk_of_a_vector_mostly_of_zeros_is_exact[300]"],
    "sparse-topk-first-k": ["tests/compression/test_codecs.py::test_topk_of_a_vector_mostly_of_zeros_is_exact[1200]"],
    "bit-packing-on-any-byte-order": ["tests/compression/test_codecs.py::"
                                      "test_the_bit_packing_codes_refuse_a_big_endian_machine"],
    "warm-server-started-unblocked": ["tests/jobs/test_soundness.py::"
                                      "test_a_sigterm_to_the_warm_server_in_its_first_instants_does_not_end_it"],
    "late-stop-unreported": ["tests/jobs/test_stop_signals.py::"
                             "test_a_sigterm_as_the_record_is_written_lets_it_be_written_and_the_comparison_stops"],
    "attempt-store-unprefixed": ["tests/test_data_split.py::test_a_restarted_torchrun_attempt_reads_no_count_of_the_dead_one"],
    "momentum-in-the-model-s-code": [f"{OC}::test_the_outer_momentum_is_mixed_as_the_models_are[hop-int8]"],
    "rates-from-a-few-batches": ["tests/test_data_split.py::test_a_few_batches_give_no_rate_at_all"],
    "int4-one-value-per-byte": ["tests/compression/test_codecs.py::test_int4_holds_its_grid_exactly_in_half_a_byte_per_value"],
    "plan-shards-frozen": [f"{PT}::test_a_planned_cnn_learns_digits_and_every_checked_step_equals_the_whole_model",
                           f"{PTC}::test_real_optimizer_steps_follow_the_whole_model_and_the_copies_agree"],
    # issue 68 (item 5): plan --train checks training, not one step
    "plan-update-unlike-the-whole-model": [
        f"{PTC}::test_real_optimizer_steps_follow_the_whole_model_and_the_copies_agree"],
    "plan-replicas-disagree": [f"{PTC}::test_real_optimizer_steps_follow_the_whole_model_and_the_copies_agree"],
    "plan-verdict-ignores-replicas": [
        f"{PTC}::test_the_verdict_fails_on_copies_that_disagree_an_update_unlike_the_whole_model_or_no_trajectory"],
    "plan-bias-on-every-rank": [f"{PT}::test_every_split_type_unequal_ratios_and_a_residual_join_train_exactly"],
    "plan-flat-reductions": [
        f"{PT}::test_a_replicated_tensor_crosses_each_level_once_per_side_as_the_cost_model_counts"],
    # issue 39's: one link clock, the server's arrival, one iteration counter
    "link-ingress-own-rule": ["tests/transport/test_link_clock.py::test_the_runtime_and_the_simulator_book_messages_alike"],
    "server-not-last": ["tests/runtime/test_progress_beacon.py::test_the_server_is_waited_for_while_it_serves_the_last_worker"],
    "iteration-from-logic": [
        "tests/runtime/test_comm_protocols.py::test_auto_local_work_gives_a_slower_worker_fewer_local_steps"],
    "finished-neighbours-sent-to": [  # issue 37's finish stall
        "tests/runtime/test_finished_neighbours.py::test_a_neighbour_that_finished_before_the_repair_is_stopped_and_sent_nothing"],
    "interim-edges-ignored": [  # a respawn stall: a death and its replacement seen in one look
        "tests/runtime/test_finished_neighbours.py::"
        "test_a_death_and_its_replacement_seen_in_one_look_still_listens_on_the_edges_others_repaired",
        "tests/jobs/test_respawn.py::test_edges_a_repair_made_and_a_join_unmade_neither_hang_nor_end_the_job"],
    "hop-resumed-from-own-iteration": [  # seen once in CI, 2026-12-07
        "tests/jobs/test_failures.py::test_a_killed_job_resumes_from_its_checkpoints_and_finishes_its_iterations"
        "[hop-extra0]"],
    "resumed-from-own-iteration": [  # seen once under load in the slow suite, 2026-12-06
        "tests/jobs/test_failures.py::test_a_killed_job_resumes_from_its_checkpoints_and_finishes_its_iterations"
        "[prague-extra4]"],
    "outer-defaults-diloco-always": ["tests/comm/test_comm_carrier.py::test_the_outer_defaults_follow_the_optimizer_inside"],
    "long-tempdir-forkserver": ["tests/jobs/test_startup.py::"
                                "test_a_temp_dir_too_long_for_the_servers_socket_falls_back_to_spawn_saying_so"],
    "orphaned-job-dirs-kept": ["tests/jobs/test_soundness.py::"
                               "test_killing_the_launcher_leaves_no_worker_behind_and_the_next_job_removes_its_folder"],
    "anchors-in-the-model-s-code": ["tests/runtime/test_outer_consensus.py::"
                                    "test_compressed_groups_send_the_anchors_one_bit_a_value"],
    "arrivals-progress-forever": [
        "tests/runtime/test_progress_beacon.py::test_workers_that_stop_stepping_and_arriving_are_given_up_on_naming_them"],
    "arrivals-not-progress": [  # the finish-straggler test's failure under load, 2026-12-06
        "tests/runtime/test_progress_beacon.py::test_workers_that_waited_on_one_just_arrived_are_waited_for"],
    "every-worker-scores-the-final-model": [
        "tests/jobs/test_final_model.py::test_one_worker_evaluates_the_final_model_that_every_worker_holds"],
    "record-unheld": ["tests/jobs/test_stop_signals.py::"
                      "test_a_sigterm_as_the_record_is_written_lets_it_be_written_and_the_comparison_stops"],
    "comparison-goes-on-after-a-stop": [
        "tests/jobs/test_stop_signals.py::"
        "test_a_sigterm_as_the_record_is_written_lets_it_be_written_and_the_comparison_stops"],
    "one-queue-for-all": ["tests/jobs/test_local_job.py::test_a_worker_killed_mid_message_stops_only_its_own_messages"],
    "workers-die-on-sigterm": ["tests/jobs/test_soundness.py::"
                               "test_sigterm_stops_the_workers_and_writes_what_the_run_had_and_its_checkpoint[every-process]"],
    "results-whole-through-the-pipe": [
        "tests/jobs/test_local_job.py::test_a_worker_killed_while_its_result_is_written_is_a_death_not_a_hang",
        "tests/jobs/test_local_job.py::test_a_result_goes_through_a_file_and_whole_through_the_queue_where_no_file_can_be_written"],
    "replaced-edge-kept": ["tests/runtime/test_finished_neighbours.py::"
                           "test_a_death_and_its_replacement_seen_in_one_look_still_listens_on_the_edges_others_repaired"],
    "idle-edges-bounded": [  # a respawn job failed a few timeouts after a replacement joined
        "tests/jobs/test_respawn.py::test_edges_a_repair_made_and_a_join_unmade_neither_hang_nor_end_the_job"],
    # a replacement admitted as the job ends, or dead just after its admission (respawn)
    "unsettled-replacements-kept": [
        "tests/jobs/test_replacement_at_the_end.py::"
        "test_closing_the_membership_stops_an_admitted_replacement_that_holds_no_model_yet"],
    "freeze-after-the-wait": [
        "tests/jobs/test_replacement_at_the_end.py::test_the_final_average_closes_the_membership_before_it_waits_for_anyone"],
    "replacements-admitted-together": [
        "tests/jobs/test_replacement_at_the_end.py::"
        "test_replacements_are_admitted_one_at_a_time_each_once_the_one_before_holds_a_model"],
    "first-sends-unwatched": [
        "tests/transport/test_first_send.py::test_a_first_send_to_a_process_that_never_connects_ends_when_it_is_named_dead"],
    # the docs' records and results cited by file (scripts/cite_records.py)
    "citations-left-as-they-were": [f"{DR}::test_a_citation_by_title_over_a_line_break_names_the_record_file",
                                    f"{DR}::test_a_citation_of_a_part_of_a_record_keeps_the_part_s_title"],
    "part-titles-dropped": [f"{DR}::test_a_citation_of_a_part_of_a_record_keeps_the_part_s_title"],
    "unplaced-citations-unreported": [f"{DR}::test_a_citation_it_cannot_place_is_reported_and_left_as_it_was"],
    "record-citations-unseen": [f"{DR}::test_every_cited_record_and_result_exists"],
    "decoders-scaled": ["tests/compression/test_codecs.py::test_topk_keeps_exactly_the_largest_values_and_nothing_else",
                        "tests/compression/test_codecs.py::test_powersgd_reconstructs_a_low_rank_model_and_sends_vectors_whole",
                        "tests/compression/test_codecs.py::test_quantizers_decode_to_the_values_not_a_scaled_copy"],
    # the docs (issue 70): the generated CLI reference and the README's examples
    "cli-reference-without-last-flag": [
        "tests/docs/test_cli_reference.py::test_the_reference_names_every_flag_of_every_command",
        "tests/docs/test_site_build.py::test_the_site_builds_strict_with_the_generated_references"],
    "compare-writes-no-plot": ["tests/docs/test_readme_runs.py::test_the_readme_first_run_trains_and_writes_what_it_says"],
    "no-comm": ["tests/docs/test_readme_runs.py::test_the_readme_python_api_block_trains_to_one_consensus_model"],
    # the public classes' keywords written out in each def (issue 70)
    "setting-without-keyword": [  # every public class (parametrized)
        "tests/runtime/test_api.py::test_every_setting_is_a_keyword_of_the_def_with_its_field_s_default_and_help_shows_it"],
    "every-keyword-taken-as-default": [
        "tests/runtime/test_api.py::test_the_keywords_given_reach_the_options_and_comm_settings_and_clash_with_the_objects"],
    "launcher-hook-public": ["tests/test_public_contract.py::test_the_public_contract_is_the_snapshot"],
    # the phases after the bar's 100% (issue 70): the finish, then the evaluation of the kept models
    "evaluation-unshown": ["tests/jobs/test_phases_after_training.py::"
                           "test_the_evaluation_of_the_kept_models_shows_its_progress_and_is_silent_when_asked"],
    "finish-unannounced": ["tests/jobs/test_phases_after_training.py::"
                           "test_the_bar_says_the_workers_are_finishing_once_training_is_over"],
    "plan-sizes-in-fixed-units": ["tests/planner/test_table_units.py::"
                                  "test_memory_and_bytes_sent_show_their_digits_for_a_tiny_model_and_a_large_one[lenet-8-a100:4]"],
}


def _run_tests_under(tmp_path: Path, mutant: str, tests: list[str]) -> dict[str, str | None]:
    global PROTOCOL_TESTS
    saved, PROTOCOL_TESTS = PROTOCOL_TESTS, tests
    try:
        return _run_under_mutant(tmp_path, mutant)
    finally:
        PROTOCOL_TESTS = saved


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("mutant", sorted(COMM_MUTANTS))
def test_every_communication_feature_is_missed_by_some_test_when_removed(processes, tmp_path, mutant):
    """Each mutant makes every test named for it fail on an assertion (and the same tests pass unmutated:
    the default suite runs them)."""
    outcomes = _run_tests_under(tmp_path, mutant, COMM_MUTANTS[mutant])
    assert outcomes, f"{mutant}: no test ran"
    passed = [name for name, message in outcomes.items() if message is None]
    assert not passed, f"{mutant}: these pass with the feature removed: {passed}"
    not_assertions = {name: message[:200] for name, message in outcomes.items()
                      if not message.startswith(("AssertionError", "assert"))}
    assert not not_assertions, f"{mutant}: failed for another reason than their assertions: {not_assertions}"


def test_every_mutant_named_here_is_in_the_catalog_and_the_package_reads_none():
    """The mutants live with the tests (issue 68): no module under hetrain/ reads $HETRAIN_MUTANT or
    imports them, and each mutant this file names exists."""
    assert not set(COMM_MUTANTS) - set(MUTANTS), sorted(set(COMM_MUTANTS) - set(MUTANTS))
    package = ROOT / "hetrain"
    readers = [str(path.relative_to(ROOT)) for path in package.rglob("*.py")
               if ENV in path.read_text() or "mutants" in path.read_text()]
    assert not readers, f"these modules of the package read the test kit: {readers}"
