//! `rampart-backup`: the backup service of a storage server. It holds segment replicas
//! of other masters' logs (DESIGN.md §5); it arrives with the replication issue, and
//! this crate is its home in the workspace layout of DESIGN.md §2.
