//! gRPC definitions of the locksmith server (being written).
