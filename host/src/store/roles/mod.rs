//! The store's roles: one small trait per kind of caller, and [`Store`], their sum.
//!
//! A caller asks for the least it needs; everything that holds a whole store (the
//! host, a worker, the HTTP API) holds an `Arc<dyn Store>`, which upcasts to any role
//! (`Arc<dyn Store>` → `Arc<dyn InstanceStore>`). A backend implements every role; a
//! decorator implements the one it observes and leaves the rest to an [`Overlay`].

mod catalog;
mod instance;
mod operator;
mod overlay;
mod worker;

pub use catalog::CatalogStore;
pub use instance::InstanceStore;
pub use operator::OperatorStore;
pub use overlay::Overlay;
pub use worker::WorkerStore;

/// A durable store of claims, results, runs, leases, progress, logs and components:
/// every role at once.
///
/// Implemented for whatever implements the four roles; a backend implements each role
/// and is a `Store` thereby. Methods are async and safe to call from many tasks at
/// once; a backend serialises what it must, and never blocks the caller's executor
/// thread.
pub trait Store: InstanceStore + WorkerStore + CatalogStore + OperatorStore {}

impl<T: InstanceStore + WorkerStore + CatalogStore + OperatorStore + ?Sized> Store for T {}
