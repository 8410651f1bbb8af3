//! The conformance suite and backend-specific tests against `postgres` (being written).
