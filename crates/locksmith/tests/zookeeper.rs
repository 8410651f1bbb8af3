//! The conformance suite and backend-specific tests against `zookeeper` (being written).
