"""The leader's ProgressTracker alone: built and asked with no Raft core around it."""

from rocket.raft.progress import Progress, ProgressTracker


def tracker_with(matches: dict[int, int], next_index: int = 10) -> ProgressTracker:
    tracker = ProgressTracker()
    tracker.reset(matches, next_index)
    for member, match in matches.items():
        tracker[member].acknowledge(match)
    return tracker


def test_committed_is_what_a_quorum_of_voters_holds():
    tracker = tracker_with({1: 9, 2: 7, 3: 4, 4: 2, 5: 1})
    assert tracker.committed({1, 2, 3, 4, 5}) == 4  # three of five hold 4
    assert tracker.committed({1, 2, 3}) == 7  # two of three hold 7
    assert tracker.committed({1, 2, 6}) == 7  # an untracked voter counts as holding nothing
    assert tracker.committed({1, 6, 7}) == 0  # one tracked voter of three is no quorum


def test_learners_do_not_count_towards_commit():
    tracker = tracker_with({1: 9, 2: 1, 3: 1, 4: 9})  # 4 is a learner
    assert tracker.committed({1, 2, 3}) == 1


def test_quorum_active_counts_answers_since_the_last_call():
    tracker = tracker_with({1: 0, 2: 0, 3: 0})
    assert not tracker.quorum_active({1, 2, 3}, leader=1)  # only the leader itself
    tracker[2].recent_active = True
    assert tracker.quorum_active({1, 2, 3}, leader=1)
    assert not tracker.quorum_active({1, 2, 3}, leader=1)  # the count starts anew


def test_quorum_lease_tick_is_the_quorums_oldest_answered_heartbeat():
    tracker = tracker_with({1: 0, 2: 0, 3: 0, 4: 0, 5: 0})
    voters = {1, 2, 3, 4, 5}
    assert tracker.quorum_lease_tick(voters, leader=1, now=50) == -1
    tracker[2].lease_tick, tracker[3].lease_tick = 40, 45
    assert tracker.quorum_lease_tick(voters, leader=1, now=50) == 40  # the leader (50), 45, 40
    tracker.woken()
    assert tracker.quorum_lease_tick(voters, leader=1, now=50) == -1
    assert all(progress.recent_active for _, progress in tracker.items())


def test_membership_follows_the_configuration():
    tracker = tracker_with({1: 5, 2: 5, 3: 5})
    tracker.set_members({1, 2, 4}, next_index=6)
    assert 3 not in tracker and 4 in tracker
    assert tracker[2].match == 5  # kept
    new = tracker[4]
    assert (new.match, new.next, new.state) == (0, 6, Progress.PROBE)


def test_who_is_behind():
    tracker = tracker_with({1: 9, 2: 9, 3: 4})
    assert not tracker.all_hold(9)
    assert tracker.behind(9) == {3: 5}
    tracker[3].lease_tick = 20
    assert tracker.follower_lacks(9, heard_since_tick=15, leader=1)
    assert not tracker.follower_lacks(9, heard_since_tick=25, leader=1)  # not heard from since
    assert not tracker.follower_lacks(4, heard_since_tick=15, leader=1)
    tracker[3].acknowledge(9)
    assert tracker.all_hold(9) and tracker.behind(9) == {}
