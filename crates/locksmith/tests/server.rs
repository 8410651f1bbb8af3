//! The conformance suite and backend-specific tests against `server` (being written).
