//! Tables and their tablets: creating a table (split evenly, placed round-robin over the
//! `Up` masters), dropping one, splitting one of its tablets in two on its owner, the
//! servers' tablet epochs, and the queries over tablets.

use super::command::{
    CommandResult, Outcome, Reject, TABLES_MAX, TABLETS_MAX, TABLE_NAME_BYTES_MAX, TABLE_SPAN_MAX,
};
use super::core::CoordinatorState;
use rampart_common::ids::{ServerId, TableId, TabletEpoch};
use rampart_common::tablet::{HashRange, ServerStatus, TableInfo, Tablet, TabletMap};
use std::collections::BTreeSet;

impl CoordinatorState {
    /// The id of the live table called `name`.
    pub fn table_id(&self, name: &str) -> Option<TableId> {
        self.names.get(name).copied()
    }

    /// The live tables, in id order.
    pub fn tables(&self) -> impl Iterator<Item = &TableInfo> {
        self.tables.values()
    }

    /// The live table `id`.
    pub fn table(&self, id: TableId) -> Option<&TableInfo> {
        self.tables.get(&id)
    }

    /// The tablets `owner` serves, in (table id, hash) order. Scans every table: for the
    /// rare control-path callers (enlist replies, recovery planning), not per request.
    pub fn tablets_of(&self, owner: ServerId) -> Vec<Tablet> {
        self.tables
            .values()
            .flat_map(|table| table.tablets.iter())
            .filter(|tablet| tablet.owner == owner)
            .copied()
            .collect()
    }

    /// The tablet epoch of `server`: how many changes of its tablets were committed.
    pub fn tablet_epoch(&self, server: ServerId) -> TabletEpoch {
        self.tablet_epochs.get(&server).copied().unwrap_or_default()
    }

    /// Splits `ranges` (inclusive key-hash ranges) into the parts whose tablets
    /// `server` owns and the rest, each in order.
    pub fn split_by_owner(
        &self,
        ranges: &[HashRange],
        server: ServerId,
    ) -> (Vec<HashRange>, Vec<HashRange>) {
        let (mut owned, mut other) = (Vec::new(), Vec::new());
        for &HashRange { table, start, end } in ranges {
            // Where the tablets do not reach (a dropped table): not owned.
            let mut at = Some(start);
            if let Some(info) = self.tables.get(&table) {
                let first = info.tablets.partition_point(|t| t.end_hash < start);
                for tablet in &info.tablets[first..] {
                    let Some(from) = at.filter(|from| *from <= end) else {
                        break;
                    };
                    let to = tablet.end_hash.min(end);
                    let part = HashRange::new(table, from.max(tablet.start_hash), to);
                    if tablet.owner == server {
                        owned.push(part);
                    } else {
                        other.push(part);
                    }
                    at = to.checked_add(1);
                }
            }
            if let Some(from) = at.filter(|from| *from <= end) {
                other.push(HashRange::new(table, from, end));
            }
        }
        (owned, other)
    }

    /// Bumps the tablet epoch of every server in `owners` once (a removed one has none
    /// and serves nothing); returns them with their new epochs, in id order.
    pub(super) fn bump_tablet_epochs(
        &mut self,
        owners: impl IntoIterator<Item = ServerId>,
    ) -> Vec<(ServerId, TabletEpoch)> {
        let owners: BTreeSet<ServerId> = owners
            .into_iter()
            .filter(|owner| {
                self.servers
                    .get(owner)
                    .is_some_and(|s| s.status != ServerStatus::Removed)
            })
            .collect();
        owners
            .into_iter()
            .map(|owner| {
                let epoch = self.tablet_epochs.entry(owner).or_default();
                *epoch = epoch.next();
                (owner, *epoch)
            })
            .collect()
    }

    /// The whole configuration as clients and masters cache it: version, every server and
    /// every table, both in id order.
    pub fn tablet_map(&self) -> TabletMap {
        TabletMap {
            version: self.version,
            servers: self.servers.values().cloned().collect(),
            tables: self.tables.values().cloned().collect(),
        }
    }

    /// Tables.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// Tablets over all tables.
    pub fn tablet_count(&self) -> usize {
        self.tablet_count
    }

    pub(super) fn create_table(&mut self, name: &str, span: u32) -> Result<Outcome, Reject> {
        validate_table_name(name)?;
        if !(1..=TABLE_SPAN_MAX).contains(&span) {
            return Err(Reject::SpanOutOfRange { span });
        }
        if let Some(table) = self.names.get(name).and_then(|id| self.tables.get(id)) {
            // Idempotent: even with a different span, so that a retry never fails.
            let owners: BTreeSet<ServerId> = table.tablets.iter().map(|t| t.owner).collect();
            return Ok(Outcome::Unchanged(CommandResult::TableCreated {
                id: table.id,
                tablets: table.tablets.clone(),
                created: false,
                epochs: owners
                    .into_iter()
                    .map(|owner| (owner, self.tablet_epoch(owner)))
                    .collect(),
            }));
        }
        if self.tables.len() >= TABLES_MAX {
            return Err(Reject::TooManyTables);
        }
        if self.tablet_count + span as usize > TABLETS_MAX {
            return Err(Reject::TooManyTablets {
                have: self.tablet_count,
                span,
            });
        }
        let masters: Vec<ServerId> = self
            .up_servers()
            .into_iter()
            .filter(|s| s.services.master && !self.draining.contains(&s.id))
            .map(|s| s.id)
            .collect();
        if masters.is_empty() {
            return Err(Reject::NoMasters);
        }

        // Never overflows: one id per applied command.
        let id = TableId(self.next_table_id);
        self.next_table_id += 1;
        let first = masters.partition_point(|&m| m <= self.last_placed);
        let owners = masters.iter().cycle().skip(first);
        let tablets: Vec<Tablet> = Tablet::split_hash_space(span)
            .into_iter()
            .zip(owners)
            .map(|((start_hash, end_hash), &owner)| Tablet {
                table: id,
                start_hash,
                end_hash,
                owner,
            })
            .collect();
        if let Some(last) = tablets.last() {
            self.last_placed = last.owner;
        }
        self.tablet_count += tablets.len();
        self.names.insert(name.to_owned(), id);
        self.tables.insert(
            id,
            TableInfo {
                id,
                name: name.to_owned(),
                tablets: tablets.clone(),
            },
        );
        let epochs = self.bump_tablet_epochs(tablets.iter().map(|t| t.owner));
        Ok(Outcome::Changed(CommandResult::TableCreated {
            id,
            tablets,
            created: true,
            epochs,
        }))
    }

    pub(super) fn drop_table(&mut self, id: TableId) -> Outcome {
        let Some(table) = self.tables.remove(&id) else {
            return Outcome::Unchanged(CommandResult::TableDropped {
                id: None,
                tablets: Vec::new(),
                epochs: Vec::new(),
            });
        };
        self.names.remove(&table.name);
        self.tablet_count -= table.tablets.len();
        self.abort_moves_of_table(id);
        self.pinned.retain(|range| range.table != id);
        let epochs = self.bump_tablet_epochs(table.tablets.iter().map(|t| t.owner));
        Outcome::Changed(CommandResult::TableDropped {
            id: Some(table.id),
            tablets: table.tablets,
            epochs,
        })
    }

    /// [`Command::SplitTablet`].
    pub(super) fn split_tablet(&mut self, id: TableId, at: u64) -> Result<Outcome, Reject> {
        let Some(table) = self.tables.get(&id) else {
            return Err(Reject::UnknownTable(id));
        };
        // The tablet holding `at`: the tablets cover the whole hash space, in order.
        let i = table.tablets.partition_point(|t| t.end_hash < at);
        let Some(&tablet) = table.tablets.get(i) else {
            // Cannot happen: the tablets cover the hash space (`check_invariants`).
            return Err(Reject::UnknownTable(id));
        };
        if tablet.start_hash == at {
            // A boundary already (a retry, or the table's start): nothing to split.
            let tablets = table.tablets[i.saturating_sub(1)..=i].to_vec();
            let owners: BTreeSet<ServerId> = tablets.iter().map(|t| t.owner).collect();
            return Ok(Outcome::Unchanged(CommandResult::TabletSplit {
                tablets,
                split: false,
                epochs: owners
                    .into_iter()
                    .map(|owner| (owner, self.tablet_epoch(owner)))
                    .collect(),
            }));
        }
        let owner_up = self
            .servers
            .get(&tablet.owner)
            .is_some_and(|s| s.status == ServerStatus::Up);
        if !owner_up {
            return Err(Reject::OwnerNotUp {
                table: id,
                at,
                owner: tablet.owner,
            });
        }
        if self.tablet_count >= TABLETS_MAX {
            return Err(Reject::TooManyTablets {
                have: self.tablet_count,
                span: 1,
            });
        }
        // `at > tablet.start_hash`, so `at - 1` does not wrap.
        let lower = Tablet {
            end_hash: at - 1,
            ..tablet
        };
        let upper = Tablet {
            start_hash: at,
            ..tablet
        };
        if let Some(table) = self.tables.get_mut(&id) {
            table.tablets.splice(i..=i, [lower, upper]);
        }
        self.tablet_count += 1;
        let epochs = self.bump_tablet_epochs([tablet.owner]);
        Ok(Outcome::Changed(CommandResult::TabletSplit {
            tablets: vec![lower, upper],
            split: true,
            epochs,
        }))
    }
}

fn validate_table_name(name: &str) -> Result<(), Reject> {
    if name.is_empty() {
        return Err(Reject::TableNameEmpty);
    }
    if name.len() > TABLE_NAME_BYTES_MAX {
        return Err(Reject::TableNameTooLong { len: name.len() });
    }
    if name.chars().any(char::is_control) {
        return Err(Reject::TableNameControl);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::command::Command;
    use super::super::test_support::*;
    use super::*;
    use rampart_common::status::Status;

    #[test]
    fn every_change_of_a_servers_tablets_bumps_its_tablet_epoch_once() {
        let (mut state, ids) = cluster(2);
        assert_eq!(state.tablet_epoch(ids[0]), TabletEpoch(0));
        // Two tablets of one table on each: one change each.
        let CommandResult::TableCreated { epochs, .. } = create(&mut state, "a", 4) else {
            panic!("not created");
        };
        assert_eq!(
            epochs,
            vec![(ids[0], TabletEpoch(1)), (ids[1], TabletEpoch(1))]
        );
        let CommandResult::TableCreated { epochs, .. } = create(&mut state, "b", 1) else {
            panic!("not created");
        };
        let owner = epochs[0].0;
        assert_eq!(epochs, vec![(owner, TabletEpoch(2))]);
        // A retried create changes nothing and reports the epochs as they stand.
        let CommandResult::TableCreated {
            epochs, created, ..
        } = create(&mut state, "a", 4)
        else {
            panic!("not created");
        };
        assert!(!created);
        assert_eq!(
            epochs,
            vec![
                (ids[0], state.tablet_epoch(ids[0])),
                (ids[1], state.tablet_epoch(ids[1]))
            ]
        );
        let a = state.table_id("a").expect("a");
        let dropped = state.apply(&Command::DropTable { id: a });
        let CommandResult::TableDropped { epochs, .. } = dropped else {
            panic!("not dropped");
        };
        assert_eq!(epochs.len(), 2);
        assert_eq!(state.tablet_epoch(owner), TabletEpoch(3));
        // Recovery hands a crashed server's table to the other: one change of it.
        let other = if owner == ids[0] { ids[1] } else { ids[0] };
        let before = state.tablet_epoch(other);
        crash(&mut state, owner);
        let table = state.table_id("b").expect("b");
        let result = state.apply(&recovered(owner, vec![HashRange::whole(table)], other));
        assert_eq!(
            result,
            CommandResult::PartitionRecovered {
                tablets: vec![Tablet {
                    table,
                    start_hash: 0,
                    end_hash: u64::MAX,
                    owner: other
                }],
                epoch: before.next(),
            }
        );
        state.apply(&Command::SetServerStatus {
            id: owner,
            status: ServerStatus::Removed,
        });
        assert_eq!(
            state.tablet_epoch(owner),
            TabletEpoch(0),
            "a removed server keeps none"
        );
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn split_by_owner_tells_a_servers_parts_of_ranges_from_the_rest() {
        let (mut state, ids) = cluster(2);
        let (table, tablets) = created(&mut state, "t", 2);
        let boundary = tablets[1].start_hash;
        let (first, second) = (tablets[0].owner, tablets[1].owner);
        let ranges = vec![
            HashRange::new(table, 10, boundary + 10),
            HashRange::new(TableId(99), 0, 5),
        ];
        let (owned, other) = state.split_by_owner(&ranges, first);
        assert_eq!(owned, vec![HashRange::new(table, 10, boundary - 1)]);
        assert_eq!(
            other,
            vec![
                HashRange::new(table, boundary, boundary + 10),
                HashRange::new(TableId(99), 0, 5)
            ],
            "another owner's part, and a table that does not exist"
        );
        let (owned, _) = state.split_by_owner(&ranges, second);
        assert_eq!(owned, vec![HashRange::new(table, boundary, boundary + 10)]);
        assert!(ids.contains(&first) && ids.contains(&second));
    }

    #[test]
    fn create_table_splits_evenly_and_covers_the_hash_space() {
        let (mut state, ids) = cluster(4);
        let (id, tablets) = created(&mut state, "users", 4);
        assert_eq!(id, TableId(1));
        assert_eq!(state.table_id("users"), Some(id));
        let table = state.table(id).expect("created");
        assert_eq!(table.name, "users");
        assert_eq!(table.tablets, tablets);
        assert_eq!(tablets.len(), 4);
        assert_eq!(tablets[0].start_hash, 0);
        assert_eq!(tablets[3].end_hash, u64::MAX);
        for pair in tablets.windows(2) {
            assert_eq!(pair[0].end_hash + 1, pair[1].start_hash);
        }
        for tablet in &tablets {
            assert_eq!(tablet.table, id);
            assert_eq!(tablet.end_hash - tablet.start_hash, u64::MAX / 4);
        }
        let owners: Vec<ServerId> = tablets.iter().map(|t| t.owner).collect();
        assert_eq!(owners, ids, "one tablet per master, in id order");
        assert_eq!(state.version(), 5);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn create_table_wider_than_the_cluster_wraps_round_robin() {
        let (mut state, ids) = cluster(3);
        let (_, tablets) = created(&mut state, "wide", 7);
        let owners: Vec<u64> = tablets.iter().map(|t| t.owner.0).collect();
        assert_eq!(owners, vec![1, 2, 3, 1, 2, 3, 1]);
        // The cursor continues where the last table stopped.
        let (_, next) = created(&mut state, "next", 2);
        let owners: Vec<ServerId> = next.iter().map(|t| t.owner).collect();
        assert_eq!(owners, vec![ids[1], ids[2]]);
    }

    #[test]
    fn many_single_tablet_tables_spread_over_all_masters() {
        let (mut state, ids) = cluster(5);
        for i in 0..20 {
            created(&mut state, &format!("t{i}"), 1);
        }
        for id in &ids {
            assert_eq!(state.tablets_of(*id).len(), 4, "{id}");
        }
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn create_table_skips_crashed_servers_and_backup_only_servers() {
        let (mut state, ids) = cluster(3);
        let backup = enlist(&mut state, "10.0.1.0:7000", BACKUP_ONLY);
        state.apply(&Command::SetServerStatus {
            id: ids[1],
            status: ServerStatus::Crashed,
        });
        let (_, tablets) = created(&mut state, "t", 4);
        let owners: Vec<ServerId> = tablets.iter().map(|t| t.owner).collect();
        assert_eq!(owners, vec![ids[0], ids[2], ids[0], ids[2]]);
        assert!(state.tablets_of(backup).is_empty());
    }

    #[test]
    fn create_table_cursor_survives_the_last_placed_master_crashing() {
        let (mut state, ids) = cluster(3);
        created(&mut state, "a", 2);
        state.apply(&Command::SetServerStatus {
            id: ids[1],
            status: ServerStatus::Crashed,
        });
        let (_, tablets) = created(&mut state, "b", 1);
        assert_eq!(tablets[0].owner, ids[2], "first up master after the cursor");
    }

    #[test]
    fn create_existing_name_returns_the_same_table_unchanged() {
        let (mut state, _) = cluster(2);
        let (id, tablets) = created(&mut state, "t", 2);
        let before = state.clone();
        let again = create(&mut state, "t", 5);
        assert_eq!(
            again,
            CommandResult::TableCreated {
                id,
                tablets,
                created: false,
                epochs: vec![(ServerId(1), TabletEpoch(1)), (ServerId(2), TabletEpoch(1))],
            }
        );
        assert_eq!(state, before, "no version bump, no cursor move");
    }

    #[test]
    fn create_existing_name_succeeds_even_without_masters() {
        let (mut state, ids) = cluster(1);
        let (id, _) = created(&mut state, "t", 1);
        state.apply(&Command::SetServerStatus {
            id: ids[0],
            status: ServerStatus::Crashed,
        });
        assert!(matches!(
            create(&mut state, "t", 1),
            CommandResult::TableCreated { id: got, created: false, .. } if got == id
        ));
    }

    #[test]
    fn create_after_drop_gets_a_new_id() {
        let (mut state, _) = cluster(1);
        let (first, tablets) = created(&mut state, "t", 3);
        assert_eq!(
            state.apply(&Command::DropTable { id: first }),
            CommandResult::TableDropped {
                id: Some(first),
                tablets,
                epochs: vec![(ServerId(1), TabletEpoch(2))],
            }
        );
        assert_eq!(state.table_id("t"), None);
        assert_eq!(state.table(first), None);
        assert!(state.tablets_of(ServerId(1)).is_empty());
        let (second, _) = created(&mut state, "t", 1);
        assert_eq!(second, TableId(2));
        assert_ne!(first, second);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn a_drop_repeated_after_the_name_was_re_created_leaves_the_new_table() {
        // A client's drop commits but its reply is lost; another client creates the name
        // again; the first client's library sends its drop again.
        let (mut state, _) = cluster(2);
        let (old, _) = created(&mut state, "t", 1);
        state.apply(&Command::DropTable { id: old });
        let (new, _) = created(&mut state, "t", 2);
        let again = state.apply(&Command::DropTable { id: old });
        assert!(matches!(
            again,
            CommandResult::TableDropped { id: None, .. }
        ));
        assert_eq!(state.table_id("t"), Some(new), "the new table survives");
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn drop_unknown_table_is_idempotent() {
        let (mut state, _) = cluster(1);
        let (id, _) = created(&mut state, "t", 1);
        state.apply(&Command::DropTable { id });
        let before = state.clone();
        for id in [id, TableId(77), TableId(0)] {
            let result = state.apply(&Command::DropTable { id });
            assert_eq!(
                result,
                CommandResult::TableDropped {
                    id: None,
                    tablets: vec![],
                    epochs: vec![],
                }
            );
        }
        assert_eq!(state, before);
    }

    #[test]
    fn create_table_with_bad_name_or_span_is_rejected_without_change() {
        let (mut state, _) = cluster(2);
        created(&mut state, "ok", 1);
        let long = "n".repeat(TABLE_NAME_BYTES_MAX + 1);
        let longest = "n".repeat(TABLE_NAME_BYTES_MAX);
        for (name, span) in [
            ("", 1),
            (long.as_str(), 1),
            ("tab\tle", 1),
            ("new\nline", 1),
            ("nul\0", 1),
            ("del\u{7f}", 1),
            ("fine", 0),
            ("fine", TABLE_SPAN_MAX + 1),
            ("fine", u32::MAX),
            // Bad arguments are refused even when the name exists.
            ("ok", 0),
        ] {
            let command = Command::CreateTable {
                name: name.to_owned(),
                span,
            };
            assert_rejected(&mut state, command, Status::InvalidArgument);
        }
        created(&mut state, &longest, TABLE_SPAN_MAX);
        created(&mut state, "ünïcödé 表", 1);
    }

    #[test]
    fn create_table_without_up_masters_is_rejected_without_change() {
        let mut state = CoordinatorState::new();
        let command = Command::CreateTable {
            name: "t".into(),
            span: 1,
        };
        assert_rejected(&mut state, command.clone(), Status::NotEnoughServers);
        enlist(&mut state, "10.0.1.0:7000", BACKUP_ONLY);
        assert_rejected(&mut state, command.clone(), Status::NotEnoughServers);
        let master = enlist(&mut state, "10.0.0.0:7000", BOTH);
        state.apply(&Command::SetServerStatus {
            id: master,
            status: ServerStatus::Crashed,
        });
        assert_rejected(&mut state, command, Status::NotEnoughServers);
    }

    #[test]
    fn create_table_beyond_the_table_limit_is_rejected() {
        let (mut state, _) = cluster(1);
        for i in 0..TABLES_MAX {
            created(&mut state, &format!("t{i}"), 1);
        }
        let before = state.clone();
        match create(&mut state, "one-more", 1) {
            CommandResult::Rejected { status, detail } => {
                assert_eq!(status, Status::InvalidArgument);
                assert!(detail.contains("too many tables"), "{detail}");
            }
            other => panic!("not rejected: {other:?}"),
        }
        assert_eq!(state, before);
        // An existing name is still answered.
        assert!(matches!(
            create(&mut state, "t0", 1),
            CommandResult::TableCreated { created: false, .. }
        ));
    }

    #[test]
    fn create_table_beyond_the_tablet_limit_is_rejected() {
        let (mut state, _) = cluster(1);
        let full = TABLETS_MAX / TABLE_SPAN_MAX as usize;
        for i in 0..full {
            created(&mut state, &format!("t{i}"), TABLE_SPAN_MAX);
        }
        assert_rejected(
            &mut state,
            Command::CreateTable {
                name: "x".into(),
                span: 1,
            },
            Status::InvalidArgument,
        );
        let t0 = state.table_id("t0").expect("t0");
        state.apply(&Command::DropTable { id: t0 });
        created(&mut state, "x", TABLE_SPAN_MAX);
        assert_eq!(state.check_invariants(), Ok(()));
    }

    fn split(state: &mut CoordinatorState, table: TableId, at: u64) -> CommandResult {
        state.apply(&Command::SplitTablet { table, at })
    }

    #[test]
    fn a_split_cuts_one_tablet_in_two_on_its_owner_and_bumps_only_its_epoch() {
        let (mut state, _) = cluster(2);
        let (id, tablets) = created(&mut state, "t", 2);
        let (a, b) = (tablets[0].owner, tablets[1].owner);
        assert_ne!(a, b);
        let (epoch_a, epoch_b, version) = (
            state.tablet_epoch(a),
            state.tablet_epoch(b),
            state.version(),
        );
        let result = split(&mut state, id, 1000);
        let lower = Tablet {
            end_hash: 999,
            ..tablets[0]
        };
        let upper = Tablet {
            start_hash: 1000,
            ..tablets[0]
        };
        assert_eq!(
            result,
            CommandResult::TabletSplit {
                tablets: vec![lower, upper],
                split: true,
                epochs: vec![(a, epoch_a.next())],
            }
        );
        let table = state.table(id).expect("table");
        assert_eq!(table.tablets, vec![lower, upper, tablets[1]]);
        assert_eq!(state.tablet_count(), 3);
        assert_eq!(
            state.tablet_epoch(b),
            epoch_b,
            "the other owner saw no change"
        );
        assert_eq!(state.version(), version + 1);
        assert_eq!(state.tablets_of(a), vec![lower, upper]);
        assert_eq!(state.check_invariants(), Ok(()));
        // The last hash alone can be a tablet.
        let CommandResult::TabletSplit {
            tablets,
            split: true,
            ..
        } = split(&mut state, id, u64::MAX)
        else {
            panic!("not split");
        };
        assert_eq!(
            tablets
                .iter()
                .map(|t| (t.start_hash, t.end_hash))
                .collect::<Vec<_>>(),
            vec![(1 << 63, u64::MAX - 1), (u64::MAX, u64::MAX)]
        );
        assert_eq!(state.check_invariants(), Ok(()));
    }

    #[test]
    fn a_split_where_a_tablet_starts_changes_nothing_and_answers_as_it_stands() {
        let (mut state, _) = cluster(2);
        let (id, tablets) = created(&mut state, "t", 2);
        let CommandResult::TabletSplit { epochs, .. } = split(&mut state, id, 1000) else {
            panic!("not split");
        };
        let before = state.clone();
        // A retry of that split.
        let CommandResult::TabletSplit {
            tablets: halves,
            split: false,
            epochs: again,
        } = split(&mut state, id, 1000)
        else {
            panic!("not answered");
        };
        assert_eq!(
            halves
                .iter()
                .map(|t| (t.start_hash, t.end_hash))
                .collect::<Vec<_>>(),
            vec![(0, 999), (1000, (1 << 63) - 1)]
        );
        assert_eq!(again, epochs, "the epochs as they stand");
        // Where the table's tablets met from the start, and the table's first hash.
        let CommandResult::TabletSplit {
            tablets: met,
            split: false,
            epochs,
        } = split(&mut state, id, 1 << 63)
        else {
            panic!("not answered");
        };
        assert_eq!(met[1], tablets[1]);
        assert_eq!(epochs.len(), 2);
        let CommandResult::TabletSplit {
            tablets: first,
            split: false,
            ..
        } = split(&mut state, id, 0)
        else {
            panic!("not answered");
        };
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].start_hash, 0);
        assert_eq!(state, before);
    }

    #[test]
    fn a_split_of_an_unknown_table_or_a_crashed_owners_tablet_is_refused() {
        let (mut state, _) = cluster(2);
        let (id, tablets) = created(&mut state, "t", 2);
        let unknown = Command::SplitTablet {
            table: TableId(99),
            at: 5,
        };
        assert_rejected(&mut state, unknown, Status::TableDoesntExist);
        crash(&mut state, tablets[0].owner);
        let under_recovery = Command::SplitTablet { table: id, at: 5 };
        assert_rejected(&mut state, under_recovery, Status::Retry);
        // The other owner's tablet splits.
        let CommandResult::TabletSplit { split: true, .. } = split(&mut state, id, (1 << 63) + 5)
        else {
            panic!("not split");
        };
    }

    #[test]
    fn a_split_beyond_the_tablet_limit_is_refused() {
        let (mut state, _) = cluster(1);
        let full = TABLETS_MAX / TABLE_SPAN_MAX as usize;
        for i in 0..full {
            created(&mut state, &format!("t{i}"), TABLE_SPAN_MAX);
        }
        let t0 = state.table_id("t0").expect("t0");
        let beyond = Command::SplitTablet { table: t0, at: 1 };
        assert_rejected(&mut state, beyond, Status::InvalidArgument);
        // A retry of a split already made needs no room.
        let boundary = state.table(t0).expect("t0").tablets[1].start_hash;
        assert!(matches!(
            split(&mut state, t0, boundary),
            CommandResult::TabletSplit { split: false, .. }
        ));
    }

    #[test]
    fn tablet_map_lists_everything_at_the_current_version() {
        let (mut state, _) = cluster(2);
        created(&mut state, "b", 1);
        created(&mut state, "a", 2);
        let map = state.tablet_map();
        assert_eq!(map.version, state.version());
        assert_eq!(map.servers.len(), 2);
        let names: Vec<&str> = map.tables.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, vec!["b", "a"], "tables in id order");
    }
}
