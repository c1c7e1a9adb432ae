//! A key-value store that speaks PyTorch's c10d `TCPStore` protocol: a [`StoreClient`] and a
//! [`StoreServer`].
//!
//! The [`Rendezvous`](crate::Rendezvous) is built on it, and it is also how Rust and Python
//! processes meet: a PyTorch `torch.distributed.TCPStore(host, port, is_master=False)` can use a
//! [`StoreServer`], and a [`StoreClient`] can use a store that PyTorch hosts
//! (`TCPStore(..., is_master=True)`, either of its server backends) — under `torchrun`, the
//! agent's own store. The bytes on the wire are described in [`codec`].
//!
//! ```no_run
//! use std::time::Duration;
//! use gpucomm_launch::store::{Limits, StoreClient, StoreServer};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = StoreServer::bind("127.0.0.1:29600".parse()?, Limits::default())?;
//! let mut client = StoreClient::connect("127.0.0.1", 29600, Duration::from_secs(10))?;
//! // Python: TCPStore("127.0.0.1", 29600, is_master=False).set("answer", b"42")
//! // arrives here as the key "/answer".
//! if client.wait(&["/answer"], Duration::from_secs(60))? {
//!     println!("{:?}", client.get("/answer")?);
//! }
//! # drop(server);
//! # Ok(())
//! # }
//! ```
//!
//! # Security
//!
//! A TCPStore has no access control: anyone who can reach the port can read and write every
//! key (PyTorch's documentation says the same of its `TCPStore`). Host it on a trusted network,
//! or protect what you put in it — the rendezvous does, with a job key (see the crate's
//! documentation). What the server does protect is itself: see [`StoreServer`] and [`Limits`].

mod client;
pub mod codec;
mod error;
mod limits;
mod server;

pub use client::StoreClient;
pub use error::StoreError;
pub use limits::Limits;
pub use server::{ServerStats, StoreServer};
