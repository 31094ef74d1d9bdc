//! idem host.
