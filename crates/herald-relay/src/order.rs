//! Which claimed rows may be published now, and in which groups: pure logic, no I/O.
//!
//! Rows without an ordering key may go in any order, each alone. Rows with a key must reach Herald in
//! outbox (`seq`) order. A relay's claim skips rows another relay holds, so it can hold row 7 of key `k`
//! while another relay holds row 5 of `k`: publishing 7 then would overtake 5. So a claimed keyed row is
//! published only when every unrelayed row of its key before it is claimed by this relay too — the claimed
//! rows of one key are published one after the other, up to the first row of that key held elsewhere.

use std::collections::{BTreeMap, HashSet};

use crate::row::OutboxRow;

/// Rows to publish one after the other (one ordering key, in `seq` order, or one unkeyed row); groups are
/// independent of each other.
pub type Group = Vec<OutboxRow>;

/// The distinct ordering keys of claimed rows and the highest `seq` among those rows: what to ask the
/// database about (see [`publishable`]).
pub fn keys_to_check(claimed: &[OutboxRow]) -> (Vec<String>, i64) {
    let mut keys: Vec<String> = claimed.iter().filter_map(|r| r.ordering_key.clone()).collect();
    keys.sort();
    keys.dedup();
    let max = claimed
        .iter()
        .filter(|r| r.ordering_key.is_some())
        .map(|r| r.seq)
        .max()
        .unwrap_or(0);
    (keys, max)
}

/// Split `claimed` (in `seq` order) into groups to publish, given `unrelayed`: every unrelayed row
/// (`seq`, key) of the claimed rows' keys up to their highest `seq`, claimed or not. Claimed rows that
/// must wait for a row held elsewhere are left out (released for a later batch).
pub fn publishable(claimed: Vec<OutboxRow>, unrelayed: &[(i64, String)]) -> Vec<Group> {
    let mine: HashSet<i64> = claimed.iter().map(|r| r.seq).collect();
    // Per key, the first seq not claimed by this relay: rows of the key at or after it wait.
    let mut blocked_from: BTreeMap<&str, i64> = BTreeMap::new();
    for (seq, key) in unrelayed {
        if !mine.contains(seq) {
            let first = blocked_from.entry(key.as_str()).or_insert(*seq);
            *first = (*first).min(*seq);
        }
    }
    let mut groups: Vec<Group> = Vec::new();
    let mut by_key: BTreeMap<String, Group> = BTreeMap::new();
    for row in claimed {
        match &row.ordering_key {
            None => groups.push(vec![row]),
            Some(key) => {
                if blocked_from.get(key.as_str()).is_some_and(|&first| first < row.seq) {
                    continue;
                }
                by_key.entry(key.clone()).or_default().push(row);
            }
        }
    }
    groups.extend(by_key.into_values());
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, key: Option<&str>) -> OutboxRow {
        OutboxRow {
            seq,
            event_id: format!("e{seq}"),
            app: "app".into(),
            event_type: "t".into(),
            payload: "{}".into(),
            channels: None,
            ordering_key: key.map(str::to_owned),
            created_at_ms: 0,
        }
    }

    fn seqs(groups: &[Group]) -> Vec<Vec<i64>> {
        let mut out: Vec<Vec<i64>> = groups.iter().map(|g| g.iter().map(|r| r.seq).collect()).collect();
        out.sort();
        out
    }

    #[test]
    fn unkeyed_rows_go_alone() {
        let groups = publishable(vec![row(1, None), row(2, None)], &[]);
        assert_eq!(seqs(&groups), vec![vec![1], vec![2]]);
    }

    #[test]
    fn a_key_is_one_group_in_seq_order() {
        let claimed = vec![row(1, Some("a")), row(2, Some("b")), row(3, Some("a"))];
        let unrelayed = vec![(1, "a".into()), (2, "b".into()), (3, "a".into())];
        assert_eq!(seqs(&publishable(claimed, &unrelayed)), vec![vec![1, 3], vec![2]]);
    }

    #[test]
    fn rows_behind_a_row_held_elsewhere_wait() {
        // Row 2 of key a is held by another relay: 3 and 5 (a) wait; 4 (b) and 6 (unkeyed) go.
        let claimed = vec![row(3, Some("a")), row(4, Some("b")), row(5, Some("a")), row(6, None)];
        let unrelayed = vec![(2, "a".into()), (3, "a".into()), (4, "b".into()), (5, "a".into())];
        assert_eq!(seqs(&publishable(claimed, &unrelayed)), vec![vec![4], vec![6]]);
    }

    #[test]
    fn a_gap_inside_a_key_stops_the_group_there() {
        // 1 and 4 of key a are mine, 2 is held elsewhere: only 1 goes.
        let claimed = vec![row(1, Some("a")), row(4, Some("a"))];
        let unrelayed = vec![(1, "a".into()), (2, "a".into()), (4, "a".into())];
        assert_eq!(seqs(&publishable(claimed, &unrelayed)), vec![vec![1]]);
    }

    #[test]
    fn keys_to_check_are_distinct_with_the_highest_keyed_seq() {
        let claimed = vec![row(1, Some("a")), row(2, Some("a")), row(3, Some("b")), row(9, None)];
        assert_eq!(keys_to_check(&claimed), (vec!["a".to_owned(), "b".to_owned()], 3));
    }
}
