//! Offset tracking for Kafka: acknowledgements arrive in any order (the engine runs
//! several messages at once), but a Kafka commit is a single position per partition,
//! so only the lowest offset below which every message was acknowledged is committed.
//! A restart therefore resumes at the first unfinished message and never skips one.

use std::collections::{BTreeSet, HashMap};

/// A topic and partition.
pub(crate) type TopicPartition = (String, i32);

/// Outstanding offsets per assigned partition.
#[derive(Debug, Default)]
pub(crate) struct OffsetTracker {
    partitions: HashMap<TopicPartition, Partition>,
    /// Bumped at every assignment, so an acknowledgement of a message received
    /// under an earlier assignment is not mistaken for one of the same offset
    /// received again after a rebalance.
    generation: u64,
}

#[derive(Debug)]
struct Partition {
    generation: u64,
    /// Received and not yet acknowledged.
    outstanding: BTreeSet<i64>,
    /// The highest offset received in this assignment.
    highest: Option<i64>,
    /// The position last handed out for commit (the next offset to read).
    committed: Option<i64>,
}

impl OffsetTracker {
    /// A new assignment of `partitions`: they are tracked from now on, from
    /// scratch. Returns the generation messages received under it carry.
    pub(crate) fn assign(&mut self, partitions: impl IntoIterator<Item = TopicPartition>) -> u64 {
        self.generation += 1;
        for tp in partitions {
            self.partitions.insert(
                tp,
                Partition {
                    generation: self.generation,
                    outstanding: BTreeSet::new(),
                    highest: None,
                    committed: None,
                },
            );
        }
        self.generation
    }

    /// Stops tracking a revoked partition; acknowledgements of its messages that
    /// arrive later are ignored (the next owner reads them again).
    pub(crate) fn revoke(&mut self, tp: &TopicPartition) {
        self.partitions.remove(tp);
    }

    /// A message was received; returns the generation its acknowledgement must
    /// carry, or `None` when the partition is not assigned (then it is not
    /// tracked and its acknowledgement does nothing).
    pub(crate) fn received(&mut self, tp: &TopicPartition, offset: i64) -> Option<u64> {
        let p = self.partitions.get_mut(tp)?;
        p.outstanding.insert(offset);
        p.highest = Some(p.highest.map_or(offset, |h| h.max(offset)));
        Some(p.generation)
    }

    /// A message was acknowledged.
    pub(crate) fn acked(&mut self, tp: &TopicPartition, offset: i64, generation: u64) {
        if let Some(p) = self.partitions.get_mut(tp)
            && p.generation == generation
        {
            p.outstanding.remove(&offset);
        }
    }

    /// The position of one partition that may be committed now: the lowest
    /// outstanding offset, or one past the highest received when none is.
    fn commit_point(p: &Partition) -> Option<i64> {
        match p.outstanding.first() {
            Some(lowest) => Some(*lowest),
            None => p.highest.map(|h| h + 1),
        }
    }

    /// The positions that moved since the last call, to commit now; each is marked
    /// as handed out.
    pub(crate) fn take_commits(&mut self) -> Vec<(TopicPartition, i64)> {
        let mut out = Vec::new();
        for (tp, p) in &mut self.partitions {
            if let Some(point) = Self::commit_point(p)
                && p.committed.is_none_or(|c| point > c)
            {
                p.committed = Some(point);
                out.push((tp.clone(), point));
            }
        }
        out.sort();
        out
    }

    /// The positions to commit for `partitions` only (before they are revoked).
    pub(crate) fn take_commits_for(
        &mut self,
        partitions: &[TopicPartition],
    ) -> Vec<(TopicPartition, i64)> {
        let mut out = Vec::new();
        for tp in partitions {
            if let Some(p) = self.partitions.get_mut(tp)
                && let Some(point) = Self::commit_point(p)
                && p.committed.is_none_or(|c| point > c)
            {
                p.committed = Some(point);
                out.push((tp.clone(), point));
            }
        }
        out
    }

    /// Puts positions whose commit failed back, so the next round tries again.
    pub(crate) fn commit_failed(&mut self, failed: &[(TopicPartition, i64)]) {
        for (tp, point) in failed {
            if let Some(p) = self.partitions.get_mut(tp)
                && p.committed == Some(*point)
            {
                p.committed = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> TopicPartition {
        ("orders".to_string(), p)
    }

    #[test]
    fn out_of_order_acks_never_commit_past_an_unacked_offset() {
        let mut t = OffsetTracker::default();
        let g = t.assign([tp(0)]);
        for o in 10..15 {
            assert_eq!(t.received(&tp(0), o), Some(g));
        }
        // 11, 12 and 14 finish before 10 and 13.
        t.acked(&tp(0), 11, g);
        t.acked(&tp(0), 12, g);
        t.acked(&tp(0), 14, g);
        // 10 is still running: committing 10 means a restart reads 10 again.
        assert_eq!(t.take_commits(), vec![(tp(0), 10)]);
        t.acked(&tp(0), 10, g);
        // 13 is still running: never past it.
        assert_eq!(t.take_commits(), vec![(tp(0), 13)]);
        t.acked(&tp(0), 13, g);
        assert_eq!(t.take_commits(), vec![(tp(0), 15)]);
        // Nothing moved: nothing to commit.
        assert_eq!(t.take_commits(), vec![]);
    }

    #[test]
    fn partitions_are_tracked_apart() {
        let mut t = OffsetTracker::default();
        let g = t.assign([tp(0), tp(1)]);
        t.received(&tp(0), 5);
        t.received(&tp(1), 7);
        t.received(&tp(1), 8);
        t.acked(&tp(1), 8, g);
        t.acked(&tp(1), 7, g);
        assert_eq!(t.take_commits(), vec![(tp(0), 5), (tp(1), 9)]);
        t.acked(&tp(0), 5, g);
        assert_eq!(t.take_commits(), vec![(tp(0), 6)]);
    }

    #[test]
    fn a_revoked_partition_is_forgotten_and_late_acks_of_an_old_assignment_do_nothing() {
        let mut t = OffsetTracker::default();
        let old = t.assign([tp(0)]);
        t.received(&tp(0), 1);
        t.received(&tp(0), 2);
        t.revoke(&tp(0));
        assert_eq!(t.take_commits(), vec![]);
        // Not assigned: not tracked.
        assert_eq!(t.received(&tp(0), 3), None);
        let new = t.assign([tp(0)]);
        assert_ne!(old, new);
        t.received(&tp(0), 1);
        // The first copy of offset 1 finished; the second copy is still running.
        t.acked(&tp(0), 1, old);
        assert_eq!(t.take_commits(), vec![(tp(0), 1)]);
        t.acked(&tp(0), 1, new);
        assert_eq!(t.take_commits(), vec![(tp(0), 2)]);
    }

    #[test]
    fn commits_before_a_revocation_cover_only_the_revoked_partitions() {
        let mut t = OffsetTracker::default();
        let g = t.assign([tp(0), tp(1)]);
        t.received(&tp(0), 3);
        t.received(&tp(1), 4);
        t.acked(&tp(0), 3, g);
        t.acked(&tp(1), 4, g);
        assert_eq!(t.take_commits_for(&[tp(1)]), vec![(tp(1), 5)]);
        assert_eq!(t.take_commits(), vec![(tp(0), 4)]);
    }

    #[test]
    fn a_failed_commit_is_tried_again() {
        let mut t = OffsetTracker::default();
        let g = t.assign([tp(0)]);
        t.received(&tp(0), 0);
        t.acked(&tp(0), 0, g);
        let commits = t.take_commits();
        assert_eq!(commits, vec![(tp(0), 1)]);
        t.commit_failed(&commits);
        assert_eq!(t.take_commits(), vec![(tp(0), 1)]);
    }
}
