//! `rampart-client`: the table API of a Rampart cluster.
//!
//! * [`client`] — [`Client`]: tables, reads, writes, removes, increments, multi-ops
//!   and enumeration, with retries through tablet moves and coordinator leader changes
//!   until a deadline; a new client id when the lease of the last expired.
//! * [`error`] — [`ClientError`].
//! * [`failure_reporter`] — which unreachable masters the client reports to the
//!   coordinator, at most once per server per 500 ms.
//! * [`tablet_map`] — the cached tablet map used for routing.
//! * [`tracker`] — the client's id and the numbers of its writes, which make retries
//!   exactly-once, kept within what masters keep records of.
//!
//! # Example
//! Against a cluster started with `cargo run --release -p rampart-ops -- cluster up`,
//! connect to its coordinators (`127.0.0.1:7000` to `7002`, a Raft group): the client
//! finds their leader itself, and any one reachable address would do to start. This
//! example runs as a doc test; its hidden first lines start a one-member coordinator
//! group and one master in-process instead.
//!
//! ```
//! use rampart_client::{Client, RejectRules};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use rampart_common::protocol::coordinator::{Enlist, EnlistRequest};
//! # use rampart_common::rpc::{RpcPool, RpcServer};
//! # use rampart_common::coordinator_set::CoordinatorSet;
//! # use rampart_coordinator::node::{NodeConfig, RaftNode};
//! # let dir = tempfile::TempDir::new()?;
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let coordinator = listener.local_addr()?.to_string();
//! # let peers = std::collections::BTreeMap::from([(1, coordinator.clone())]);
//! # let config = NodeConfig::new(1, peers, dir.path().join("coordinator"));
//! # let node = RaftNode::start(config, tokio::runtime::Handle::current())?;
//! # let service = std::sync::Arc::new(rampart_coordinator::CoordinatorService::new(node));
//! # tokio::spawn(RpcServer::run(listener, service, std::future::pending()));
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! # let request = EnlistRequest {
//! #     addr: listener.local_addr()?.to_string(),
//! #     services: rampart_common::tablet::Services { master: true, backup: false },
//! #     failure_domain: "rack-1".into(),
//! #     disk_read_mbps: 0,
//! # };
//! # let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
//! # // The member elects itself within an election timeout; the set waits for it.
//! # let group = CoordinatorSet::new(&[coordinator.as_str()]);
//! # let id = group.call::<Enlist>(&RpcPool::new(), &request, deadline).await?.id;
//! # let config = rampart_common::config::MasterConfig {
//! #     memory_bytes: 64 << 20,
//! #     ..rampart_common::config::MasterConfig::default()
//! # };
//! # let master = std::sync::Arc::new(rampart_master::MasterService::new(id, config));
//! # tokio::spawn(RpcServer::run(listener, master, std::future::pending()));
//! # let coordinator_addr = coordinator.as_str();
//! // With a `cluster up` cluster:
//! // let coordinators = ["127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"];
//! # let coordinators = [coordinator_addr];
//! let client = Client::connect(&coordinators).await?;
//! let users = client.create_table("users", 4).await?;
//!
//! let v1 = client.write(users, b"alice", b"engineer").await?;
//! let object = client.read(users, b"alice").await?.expect("just written");
//! assert_eq!(&object.value[..], b"engineer");
//!
//! // Compare-and-swap: succeeds only if nobody wrote since v1.
//! let v2 = client.write_with(users, b"alice", b"manager", RejectRules::version_is(v1)).await?;
//! assert!(v2 > v1);
//!
//! let (visits, _) = client.increment(users, b"visits", 1).await?;
//! assert_eq!(visits, 1);
//!
//! let mut count = 0;
//! let mut pages = client.enumerate(users);
//! while let Some(page) = pages.next_page().await? {
//!     count += page.len();
//! }
//! assert_eq!(count, 2);
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod error;
pub mod failure_reporter;
pub mod tablet_map;
pub mod tracker;

pub use client::{Client, ClientOptions, Enumeration, Object, WriteItem};
pub use error::ClientError;
pub use rampart_common::ids::{TableId, Version};
pub use rampart_common::protocol::master::EnumeratedObject;
pub use rampart_common::reject::RejectRules;
