#!/usr/bin/env bash
# tier.sh [PYTEST_ARG...]: the Soft-RoCE tier. Runs, on real verbs (rdma_rxe) in a throw-away
# QEMU guest (run-in-vm.sh), the tests whose behaviour differs on verbs, with
# RDMADEV_REQUIRE_VERBS=1 (a verbs that is not viable there fails instead of skipping).
# README and .ci/run call this same script; extra arguments go to pytest (.ci/run: durations).
#
# What differs on verbs, and is run here:
# - one-sided WRITE and READ (IBV_WR_RDMA_WRITE/READ, with the signal and a zero-length write):
#   test_transfers' writes and reads of every size, a write from memory that is not a region
#   (a registration of the caller's buffer), an endpoint closed right after a write (its QP
#   drained first), a closed region's access refused (its rkey deregistered);
# - credits written back over the QP: test_channel's rings (1 and 8 slots), a slow receiver,
#   a sender blocked without credit, a broken endpoint taking only its own halves;
# - completion and QP errors: a wait on a killed peer and the progress thread reporting it;
# - registration: test_verbs (descriptor keys, dead peer within seconds, wrong GID index or
#   device, the pyverbs peer both ways, memlock limits), the registered-memory limit, and a
#   release, a parked half's memory kept for late writes (and none kept for an instantiation
#   evicted after a clean step), and a ring grown (re-registered) by the control plane between
#   task processes (test_channel_setup);
# - a connection cut between tasks: the side channel reset, QPs set up again;
# - TF's ops where they take a verbs path: a dynamic tensor's shape block, a bundle's one
#   write, RDMA READ of a stage (a tensor past its slots: staged, never rewritten before it
#   is read, outliving its sender), chunks, a dead tensor's header-only write, a write racing
#   its receiver's release, a pending wait ended by unbinding its half.
#
# With RDMADEV_SOFTROCE_FAULTS=1, then, in a second guest (FAULT_TESTS): a running job of real
# TF servers on verbs under faults. test_verbs_chaos: kill -9 of the ps and of a worker, and
# link down (rxe0's netdev set down: every verbs pair in the guest is cut), each with its
# bounds, an exact recovery run and nothing left over; test_pss_faults' kill_ps on verbs: a
# killed ps reaches a ClusterCoordinator user as TF's ps failure. Not run by default: every TF
# process costs 75-180 s to start in the guest's emulated CPU, and these start ~14 (measured:
# see the commit that added them), far past the tier's budget.
#
# Left out, and what covers each on shm and tcp in the default suite (the same code above the
# fabric): ring layout arithmetic (test_ring_layout's other cases), descriptor parsing
# (test_transfers::test_attach_rejects_garbage_descriptor), region views after close, the
# deadline, cancel and callback paths of the progress thread (test_completion), /dev/shm
# cleanup (shm only), a tensor larger than planned, ring markers and successors, a half given
# up on (test_channel), the other dtypes and ranks of a dynamic channel, a bundle's gaps and a
# mismatched bundle, staged records that do not add up, loops over labelled pairs, the other
# unbinding cases, kept buffers for large copied receives (test_tf_ops; 3:19 alone here),
# and test_channel_setup's control-plane cases: planners as neither end, receiver only, sender
# offering its credit region or both ways in one request, malformed offers,
# sender failures, regions not as planned, unreachable receivers, killed planners, half pairs
# (met first, again after a cut, past the limit, never planned), growth limits and learned
# slots (lineages), channels that cannot be set up again, and cuts repeated four times.
set -uo pipefail
cd "$(dirname "$0")/../.."

TESTS=(
    tests/test_transfers.py::test_write_lands_in_peer_region
    tests/test_transfers.py::test_read_fetches_peer_region
    tests/test_transfers.py::test_peer_writes_into_our_region
    tests/test_transfers.py::test_out_of_range_is_refused_before_sending
    tests/test_transfers.py::test_writes_from_any_memory_land_as_they_were_when_written
    tests/test_transfers.py::test_an_endpoint_closed_right_after_a_write_delivers_it
    tests/test_transfers.py::test_closed_region_refuses_new_access
    "tests/test_channel.py::test_thousands_of_transfers_arrive_intact[verbs-1]"
    "tests/test_channel.py::test_thousands_of_transfers_arrive_intact[verbs-8]"
    tests/test_channel.py::test_slow_receiver_never_sees_a_slot_overwritten
    tests/test_channel.py::test_sender_blocks_without_credit
    tests/test_channel.py::test_a_broken_endpoint_takes_only_its_own_halves_with_a_peer
    tests/test_completion.py::test_wait_on_killed_peer_fails_promptly
    tests/test_completion.py::test_progress_reports_dead_peer
    tests/test_verbs.py
    "tests/test_ring_layout.py::test_transfers_land_where_the_plan_says[verbs-4097-192]"
    "tests/test_ring_layout.py::test_a_dynamic_slots_shape_block_lands_where_the_plan_says[verbs-4]"
    tests/test_channel_setup.py::test_one_round_trip_per_pair_and_the_channels_carry_data
    tests/test_channel_setup.py::test_registered_memory_past_the_task_limit_is_refused_naming_the_setting
    tests/test_channel_setup.py::test_release_frees_regions_credits_and_mappings_on_every_task
    tests/test_channel_setup.py::test_an_instantiation_evicted_after_a_clean_step_frees_its_memory_at_once
    tests/test_channel_setup.py::test_a_setup_past_the_memory_limit_waits_for_memory_a_parked_half_keeps
    tests/test_channel_setup.py::test_channels_of_a_connection_cut_while_both_tasks_run_are_set_up_again
    tests/test_channel_setup.py::test_a_channel_whose_tensors_outgrew_its_slots_moves_to_a_larger_ring
    "tests/test_tf_ops.py::test_a_dynamic_channel_carries_the_shape[verbs-dims-dtype1-shape1]"
    "tests/test_tf_ops.py::test_a_dynamic_channel_carries_the_shape[verbs-rank-dtype0-shape0]"
    tests/test_tf_ops.py::test_a_bundle_moves_its_tensors_in_one_slot
    tests/test_tf_ops.py::test_a_tensor_many_times_a_slot_arrives_whole
    tests/test_tf_ops.py::test_a_stage_is_not_written_again_before_the_receiver_read_it
    tests/test_tf_ops.py::test_a_stage_outlives_its_unbound_sender_until_its_receiver_is_done
    tests/test_tf_ops.py::test_a_write_racing_its_receivers_release_lands_nowhere
    "tests/test_tf_ops.py::test_unbinding_a_half_ends_its_pending_wait[verbs-eager-recv]"
    "tests/test_tf_ops.py::test_unbinding_a_half_ends_its_pending_wait[verbs-function-send]"
    tests/test_tf_ops.py::test_a_dead_tensor_crosses_a_labelled_pair
)

FAULT_TESTS=(
    tests/softroce/test_verbs_chaos.py
    "tests/e2e/test_pss_faults.py::test_a_killed_ps_fails_the_coordinator_promptly[verbs]"
)

# -k verbs: of the fabric-parametrized tests listed whole, only their verbs instances.
# -n 2: two pytest workers (a test file at a time each) on the guest's two vCPUs. The guest's
# CPU is emulated, one host thread per vCPU: one worker kept one host core busy and the other
# idle (487 s of tests, 91% of one core). Each worker imports TF, hence the guest's 3 GiB.
run_tier() {
    RDMADEV_VM_MEM=${RDMADEV_VM_MEM:-3072} tests/softroce/run-in-vm.sh \
        env RDMADEV_REQUIRE_VERBS=1 python3 -m pytest -q -n 2 -p no:cacheprovider -k verbs "$@"
}
run_tier "$@" "${TESTS[@]}" || exit
[ "${RDMADEV_SOFTROCE_FAULTS:-0}" = 1 ] || exit 0
RDMADEV_VM_TIMEOUT=${RDMADEV_VM_TIMEOUT:-3600} run_tier "$@" "${FAULT_TESTS[@]}"
