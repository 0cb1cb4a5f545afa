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

/// Rows of one app to publish in one request (`POST …/msg-batch`), whole groups only, so a key's rows go
/// together, in `seq` order.
#[derive(Debug)]
pub struct Chunk {
    /// The app every row names.
    pub app: String,
    /// The groups, each still in `seq` order.
    pub groups: Vec<Group>,
}

impl Chunk {
    /// The rows in `seq` order (a key's rows keep theirs; Herald creates them in the order sent).
    pub fn rows(&self) -> Vec<&OutboxRow> {
        let mut rows: Vec<&OutboxRow> = self.groups.iter().flatten().collect();
        rows.sort_by_key(|row| row.seq);
        rows
    }
}

/// [`pack`]'s result.
#[derive(Debug, Default)]
pub struct Packed {
    /// Requests of many rows each.
    pub chunks: Vec<Chunk>,
    /// Groups whose rows name more than one app (a batch request is for one app): published row by row.
    pub one_by_one: Vec<Group>,
    /// Rows left for a later batch: the tail of a group longer than one request may carry.
    pub held_back: usize,
}

/// Pack groups into requests of one app each, at most `max_rows` rows and about `max_bytes` of payload
/// per request. A group is never split across requests (two requests in flight at once could be created
/// in either order): a group longer than `max_rows` keeps its first rows, and the rest is released for a
/// later batch, where they are the oldest rows of their key.
pub fn pack(groups: Vec<Group>, max_rows: usize, max_bytes: usize) -> Packed {
    let max_rows = max_rows.max(1);
    let mut packed = Packed::default();
    let mut open: BTreeMap<String, (Vec<Group>, usize, usize)> = BTreeMap::new();
    for mut group in groups {
        let Some(app) = group.first().map(|row| row.app.clone()) else {
            continue;
        };
        if group.iter().any(|row| row.app != app) {
            packed.one_by_one.push(group);
            continue;
        }
        if group.len() > max_rows {
            packed.held_back += group.len() - max_rows;
            group.truncate(max_rows);
        }
        let bytes: usize = group.iter().map(size_of_row).sum();
        let entry = open.entry(app.clone()).or_default();
        if !entry.0.is_empty() && (entry.1 + group.len() > max_rows || entry.2 + bytes > max_bytes) {
            let full = std::mem::take(&mut entry.0);
            packed.chunks.push(Chunk {
                app: app.clone(),
                groups: full,
            });
            entry.1 = 0;
            entry.2 = 0;
        }
        entry.1 += group.len();
        entry.2 += bytes;
        entry.0.push(group);
    }
    for (app, (groups, _, _)) in open {
        if !groups.is_empty() {
            packed.chunks.push(Chunk { app, groups });
        }
    }
    packed
}

/// About what a row adds to a batch request's body.
fn size_of_row(row: &OutboxRow) -> usize {
    row.payload.len()
        + row.event_id.len()
        + row.event_type.len()
        + row.channels.as_ref().map_or(0, String::len)
        + row.ordering_key.as_ref().map_or(0, String::len)
        + 64
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

    fn of_app(mut r: OutboxRow, app: &str) -> OutboxRow {
        r.app = app.to_owned();
        r
    }

    #[test]
    fn packing_keeps_groups_whole_and_requests_per_app() {
        let groups = vec![
            vec![row(1, Some("a")), row(3, Some("a"))],
            vec![row(2, None)],
            vec![of_app(row(4, None), "other")],
            vec![row(5, Some("b")), row(6, Some("b")), row(7, Some("b"))],
        ];
        let packed = pack(groups, 3, usize::MAX);
        let shape: Vec<(String, Vec<i64>)> = packed
            .chunks
            .iter()
            .map(|c| (c.app.clone(), c.rows().iter().map(|r| r.seq).collect()))
            .collect();
        // Group {1,3} and {2} fill the first request of `app`; {5,6,7} would not fit: a second one.
        assert_eq!(
            shape,
            vec![
                ("app".to_owned(), vec![1, 2, 3]),
                ("app".to_owned(), vec![5, 6, 7]),
                ("other".to_owned(), vec![4]),
            ]
        );
        assert_eq!(packed.held_back, 0);
        assert!(packed.one_by_one.is_empty());
    }

    #[test]
    fn a_group_longer_than_a_request_keeps_its_first_rows() {
        let groups = vec![vec![row(1, Some("a")), row(2, Some("a")), row(3, Some("a"))]];
        let packed = pack(groups, 2, usize::MAX);
        assert_eq!(packed.chunks.len(), 1);
        assert_eq!(
            packed.chunks[0].rows().iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![1, 2]
        );
        assert_eq!(packed.held_back, 1);
    }

    #[test]
    fn a_group_across_apps_goes_row_by_row_and_bytes_bound_a_request() {
        let mixed = vec![row(1, Some("a")), of_app(row(2, Some("a")), "other")];
        let packed = pack(vec![mixed, vec![row(3, None)], vec![row(4, None)]], 100, 1);
        assert_eq!(packed.one_by_one.len(), 1);
        // Each row is over the byte budget: one row per request (never none).
        assert_eq!(packed.chunks.len(), 2);
    }

    #[test]
    fn keys_to_check_are_distinct_with_the_highest_keyed_seq() {
        let claimed = vec![row(1, Some("a")), row(2, Some("a")), row(3, Some("b")), row(9, None)];
        assert_eq!(keys_to_check(&claimed), (vec!["a".to_owned(), "b".to_owned()], 3));
    }
}
