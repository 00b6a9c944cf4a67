//! `rampart-ops`: the `rampart` binary (`src/main.rs`), and what its integration tests
//! share with it.
//!
//! * [`cluster_file`] — the TOML file that describes a deployment, and the flags it stands
//!   for.
//! * [`launch`] — starting `rampart` processes and learning where they listen (their
//!   start-up lines), and the handshake of a coordinator group on free ports: for
//!   `cluster up` and the tests' harness alike.
//! * [`netns`] — private networks of network namespaces, one per "host".

pub mod cluster_file;
pub mod launch;
pub mod netns;
