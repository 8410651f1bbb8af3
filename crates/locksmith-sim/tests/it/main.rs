//! The simulation's fixed seeds, as CI runs them, through the
//! `locksmith-sim` program (a process per seed, as a replay runs it):
//! each run checked (crate docs), and one seed run twice to show it replays
//! exactly. Short runs of a debug build (tokio optimized, Cargo.toml), each
//! a few to 15 CPU-seconds (about 175 in all, AMD EPYC, 2026-12-02: the
//! largest share of the suite's CPU);
//! campaigns of many long seeds are `scripts/simulate`'s.

use std::process::Command;

/// Runs `locksmith-sim` with `args`; its output, and whether it passed.
fn simulate(args: &[&str]) -> (String, bool) {
    let output = Command::new(env!("CARGO_BIN_EXE_locksmith-sim"))
        .args(args)
        .output()
        .expect("run locksmith-sim");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (format!("{stdout}{stderr}"), output.status.success())
}

/// The settings of the first simulator (each client a host of its own, a
/// 1 ms step, no slow links, exact clocks), under which the seeds that
/// guard past defects below were found: each replays the run that failed
/// before its fix.
const FIRST_SIMULATOR: [&str; 7] = [
    "--tick-ms",
    "1",
    "--clients-per-host",
    "1",
    "--clock-skew-ms",
    "0",
    "--no-slow-links",
];

/// `args` under the first simulator's settings.
fn first_simulator<'a>(args: &[&'a str]) -> Vec<&'a str> {
    args.iter().copied().chain(FIRST_SIMULATOR).collect()
}

/// The digest a run printed.
fn digest(output: &str) -> &str {
    output
        .split("digest ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no digest in:\n{output}"))
}

/// Read-write locks, semaphores and leases (extended, or run out while
/// held) under faults: the run passes every check, and a second run of the
/// seed has the same history.
#[test]
fn a_seed_of_the_mixed_workload_passes_and_replays_exactly() {
    let args = ["--seed", "11", "--duration", "8", "--mixed"];
    let (first, passed) = simulate(&args);
    assert!(passed, "{first}");
    let (second, passed) = simulate(&args);
    assert!(passed, "{second}");
    assert_eq!(
        digest(&first),
        digest(&second),
        "the same seed, another history:\n{first}\n{second}"
    );
}

#[test]
fn a_fixed_seed_with_faults_passes_every_check() {
    let (output, passed) = simulate(&["--seeds", "1..2", "--duration", "10"]);
    assert!(passed, "{output}");
    assert!(output.contains("1 seeds, 0 failed"), "{output}");
}

/// Seed 4 of the mixed workload (15 s): a holder with a fixed lease on the
/// lock server heard of its lease's end only from the server, which ends a
/// lease and grants the next waiter in one step, so the next holder was
/// granted 4 ms before the old one was told. The model layer now ends a
/// fixed lease on the client first.
#[test]
fn a_leased_holder_is_told_before_its_lock_is_handed_on() {
    let (output, passed) = simulate(&first_simulator(&[
        "--seed",
        "4",
        "--duration",
        "15",
        "--mixed",
    ]));
    assert!(passed, "{output}");
}

/// Mixed seed 1622 (10 s), found by a campaign: a grant with a lease of
/// 218 ms, held up while the leader was down, reached its client 0.9 s
/// after the lease's term, 10 ms after the lock went to another client,
/// and `acquire` handed it out. The model layer now gives such a grant back
/// and asks again.
#[test]
fn a_lease_granted_after_its_term_is_not_handed_out() {
    let (output, passed) = simulate(&["--seed", "1622", "--duration", "10", "--mixed"]);
    assert!(passed, "{output}");
}

/// Calm seed 1464 (7 s), found by a campaign: the leader crashed at 2 s
/// for 0.68 s. Its followers still named it, so every client went back to
/// it and waited out a reconnect to a machine that answered nothing; by
/// the time it was elected again, two clients had grown their pause
/// between attempts to near a second, and their sessions (2 s TTL) ran out
/// while they slept. A session's pause now stays short beside its TTL.
#[test]
fn sessions_outlive_a_crashed_leader() {
    let (output, passed) = simulate(&["--seed", "1464", "--duration", "7", "--calm"]);
    assert!(passed, "{output}");
}

/// Calm seed 2125 (12 s), found by the 10 000-seed campaign: the leader
/// crashed at 5.6 s for 0.74 s and every client lost its session
/// (`ConnectionLost`) although a new leader served from 6.48 s. A member
/// whose connection broke now gets a short first attempt (a tenth of the
/// TTL) instead of a whole one, so that a client sent back to a crashed
/// leader by a follower's stale hint does not spend its session's time
/// waiting on a machine that answers nothing.
#[test]
fn sessions_outlive_a_crash_their_followers_still_name() {
    let (output, passed) = simulate(&["--seed", "2125", "--duration", "12", "--calm"]);
    assert!(passed, "{output}");
}

/// Seed 10 of the mixed workload (15 s): a member's connection to a peer
/// went silent without closing (the simulated TCP loses a segment for good
/// while a link drops messages), so the leader's replication to both
/// followers hung while its heartbeats, on connections of their own, kept
/// the followers from electing another: nothing committed for good, and a
/// client's release never returned. Members now ping their peers'
/// connections (HTTP/2 keep-alive) and replace a silent one.
#[test]
fn a_member_replaces_a_connection_gone_silent() {
    let (output, passed) = simulate(&first_simulator(&[
        "--seed",
        "10",
        "--duration",
        "15",
        "--mixed",
    ]));
    assert!(passed, "{output}");
}

#[test]
fn a_run_without_faults_passes_and_grants_plenty() {
    let (output, passed) = simulate(&["--seed", "5", "--duration", "5", "--no-faults"]);
    assert!(passed, "{output}");
    let grants: u64 = output
        .split(": ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no grant count in:\n{output}"));
    assert!(
        grants >= 20,
        "{grants} grants in 5 simulated seconds:\n{output}"
    );
}

/// Seed 7 (20 s) leads a member into an election while it has batches to propose:
/// openraft refuses them, and before the pause after a refusal the member
/// proposed again at once, refused at once, and simulated time stood still
/// (the run hit its real-time limit).
#[test]
fn a_leader_refused_during_an_election_does_not_spin() {
    let (output, passed) = simulate(&first_simulator(&[
        "--seed",
        "7",
        "--duration",
        "20",
        "--real-limit",
        "60",
    ]));
    assert!(passed, "{output}");
}

/// Runs `run` without and with `plant` (a past defect, put back with
/// `--plant`): it must pass without, and fail with, on the rule named.
fn find_planted(plant: &str, run: &[&str], rule: &str) {
    let (clean, passed) = simulate(run);
    assert!(passed, "{plant} fails without its plant:\n{clean}");
    let with: Vec<&str> = run.iter().copied().chain(["--plant", plant]).collect();
    let (output, passed) = simulate(&with);
    assert!(
        !passed && output.contains(rule),
        "{plant} not found (\"{rule}\" unbroken):\n{output}"
    );
}

/// One test per plant, so that the runner spreads the sixteen runs over
/// its threads (one test of all of them ran its runs at once, and last).
macro_rules! planted {
    ($($test:ident: $plant:literal on $run:expr, breaks $rule:literal;)*) => {
        $(
            #[test]
            fn $test() {
                super::find_planted($plant, $run, $rule);
            }
        )*
    };
}

/// The checks have teeth: each planted defect (module
/// `locksmith_core::planted`) with a seed that finds it, as found by the
/// hunts in docs/RELIABILITY.md ("Teeth"). A check that loses its teeth,
/// or a change that hides a defect's path, fails here. A change to what the
/// code under test draws or sends moves every run, so a seed may need
/// hunting again (`--seeds 1..N --plant P`: the first that fails on the
/// rule named, and passes without it).
mod every_planted_defect_is_found {
    planted! {
        frozen_leader: "frozen-leader"
            on &["--seed", "10", "--duration", "8", "--calm"],
            breaks "no healthy session lost";
        no_grace: "no-grace"
            on &["--seed", "11", "--duration", "20", "--calm"],
            breaks "no healthy session lost";
        stale_hint: "stale-hint"
            on &["--seed", "163", "--duration", "12", "--calm"],
            breaks "no healthy session lost";
        heartbeats_dropped: "heartbeats-dropped"
            on &["--seed", "1", "--duration", "12", "--calm"],
            breaks "no healthy session lost";
        deadline_by_equality: "deadline-by-equality"
            on &["--seed", "6", "--duration", "10", "--mixed"],
            breaks "locks are free once the clients leave";
        no_deadline_check: "no-deadline-check"
            on &["--seed", "82", "--duration", "3", "--mixed", "--lease-edge"],
            breaks "leases are kept";
        joint_finisher_race: "joint-finisher-race"
            on &["--seed", "27", "--duration", "12", "--membership", "--slow-apply"],
            breaks "the operator is told the truth";
        leader_restore: "leader-restore"
            on super::LEADER_LOST_ITS_UNSYNCED_TAIL,
            breaks "tokens rise";
    }
}

/// Mixed seed 4 (10 s): a leased grant, held up while two members' link
/// was slow, reached its client after its lease's term. The client gave it
/// back in the background and asked again at once; the store could take
/// the new ask first, as a re-entry of the late hold, which keeps that
/// hold's lease. So the new grant (token 59) ended 160 ms after it was
/// handed out, and the lock went to another client before this one was
/// told. The late grant is now given back before the acquire asks again.
#[test]
fn a_late_lease_is_given_back_before_asking_again() {
    let (output, passed) = simulate(&["--seed", "4", "--duration", "10", "--mixed"]);
    assert!(passed, "{output}");
}

/// Seed 27 with membership changes (12 s), found by the first campaign of
/// them: the leader member3 was cut off from the other members at 2 s, and
/// a new member, started at 2.15 s, asked it to be added as a learner.
/// member3 appended the learner to its own log only (the others elected
/// member1 at 2.65 s, and that entry was dropped); the joiner's ask went
/// unanswered until a broken connection at 16.4 s, which it took as a
/// refusal, and it never asked again: the operator's promotion waited for
/// a learner that never came. A joiner now bounds each ask, asks again
/// after a broken connection, and is done only once it has applied a
/// membership that names it.
#[test]
fn a_joining_member_asks_until_a_leader_has_committed_it() {
    let (output, passed) = simulate(&["--seed", "27", "--duration", "12", "--membership"]);
    assert!(passed, "{output}");
}

/// Mixed seed 21173 with membership changes and busy members (10 s): the
/// operator's first removal of member2 started a joint membership that
/// slow links left unfinished; its retries were refused while it was under
/// way, the finisher ended it at 6 s, and the next retry was rightly
/// answered `NOT_FOUND` (made before). The simulator's truth rule counted
/// that as an untruth about a change the call had made, because the member
/// led in one term throughout and showed the change made after the call.
/// A change already under way when a call starts is an earlier attempt's:
/// the rule now judges only calls that found none.
#[test]
fn a_retry_that_finds_an_earlier_change_finished_is_told_made_before() {
    let args = [
        "--seed",
        "21173",
        "--duration",
        "10",
        "--mixed",
        "--membership",
        "--slow-apply",
    ];
    let (output, passed) = simulate(&args);
    assert!(passed, "{output}");
}

/// Seed 582: the leader member1 was busy (1.1 s to apply each run of
/// committed entries) while an operator removed member4. The joint
/// membership committed and was applied, but the change's own second step
/// came later than the joint-membership finisher's patience; the finisher
/// ended the joint membership first, the change's step was refused (its
/// precondition named the joint membership), and the operator was told
/// `Unavailable` for a change that was made. The finisher now waits while
/// a change of its member's is under way.
#[test]
fn the_finisher_leaves_a_change_under_way_to_end_itself() {
    let args = [
        "--seed",
        "582",
        "--duration",
        "12",
        "--membership",
        "--slow-apply",
    ];
    let (output, passed) = simulate(&args);
    assert!(passed, "{output}");
}

/// Seed 272: the leader, member3, lost power with the tail of its Raft log
/// written but not yet synced. The other three voters had those entries and
/// had committed them (a leader's own write need not be among a commit's
/// quorum), so grants up to token 23 had been answered. Restarted, member3
/// took back its leadership of the same term at once, without an election
/// (openraft restores a leader whose vote was committed), and appended new
/// entries at the indexes its log had lost: the same log ids as the
/// followers' entries there, with other contents. The followers kept theirs
/// (an entry's id is all they compare), member3 granted tokens 18 to 38 from
/// its own, and once it was removed the next leader granted from 24 again.
/// A restarted member now always wins an election before it leads.
///
/// Since the commit notices to followers are folded into the next request
/// (the server's `raft/commit_notices.rs`), seed 272 runs differently and no
/// longer meets that moment; seed 2293 does (found in seeds 1700–2499): there
/// member3's disk turned slow (197 ms a sync) at 3.48 s and it lost power at
/// 4.05 s with the tail of its log not synced, and with the defect put back
/// the token 38 answered at 3.8 s was granted again at 5.0 s.
///
/// The run passes without the plant, and fails with it, in
/// `every_planted_defect_is_found::leader_restore`, which runs it both ways.
const LEADER_LOST_ITS_UNSYNCED_TAIL: &[&str] = &[
    "--seed",
    "2293",
    "--duration",
    "12",
    "--mixed",
    "--membership",
    "--slow-disks",
];
