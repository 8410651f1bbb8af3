//! The conformance suite and backend-specific tests against `redis` (being written).
