//! `rampart-client`: the table API of a Rampart cluster.
//!
//! * [`client`] — [`Client`]: tables, reads, writes, removes, increments, multi-ops
//!   and enumeration, with retries through tablet moves until a deadline.
//! * [`error`] — [`ClientError`].
//! * [`tablet_map`] — the cached tablet map used for routing.
//!
//! # Example
//! Start a cluster (`cargo run --release -p rampart-ops -- cluster up`), then:
//!
//! ```no_run
//! use rampart_client::{Client, RejectRules};
//!
//! # async fn example() -> Result<(), rampart_client::ClientError> {
//! let client = Client::connect(&["127.0.0.1:7000"]).await?;
//! let users = client.create_table("users", 4).await?;
//!
//! let v1 = client.write(users, b"alice", b"engineer").await?;
//! let object = client.read(users, b"alice").await?.expect("just written");
//! assert_eq!(&object.value[..], b"engineer");
//!
//! // Compare-and-swap: succeeds only if nobody wrote since v1.
//! client.write_with(users, b"alice", b"manager", RejectRules::version_is(v1)).await?;
//!
//! let visits = client.increment(users, b"visits", 1).await?.0;
//! assert_eq!(visits, 1);
//!
//! let mut pages = client.enumerate(users);
//! while let Some(page) = pages.next_page().await? {
//!     for object in page {
//!         println!("{:?} = {:?}", object.key, object.value);
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//! (The example is compiled by `cargo test --doc`; it runs against a live cluster in
//! the integration tests, which perform the same calls.)

pub mod client;
pub mod error;
pub mod tablet_map;

pub use client::{Client, ClientOptions, Enumeration, Object, WriteItem};
pub use error::ClientError;
pub use rampart_common::ids::{TableId, Version};
pub use rampart_common::protocol::master::EnumeratedObject;
pub use rampart_common::reject::RejectRules;
