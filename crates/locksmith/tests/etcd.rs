//! The conformance suite and backend-specific tests against `etcd` (being written).
