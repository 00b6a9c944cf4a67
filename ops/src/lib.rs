//! `rampart-ops`: the `rampart` binary (`src/main.rs`), and what its integration tests
//! share with it.
//!
//! * [`cluster_file`] — the TOML file that describes a deployment, and the flags it stands
//!   for.
//! * [`netns`] — private networks of network namespaces, one per "host".

pub mod cluster_file;
pub mod netns;
