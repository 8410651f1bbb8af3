//! The lock server's integration tests with the server inside the test
//! process: one test binary, `it`, with a module per concern, so the whole
//! set links once. The tests of `locksmith serve` as a process live with the
//! binary, in locksmith-cli. One module alone:
//! `cargo nextest run -p locksmith-server -E 'test(/^session_stream::/)'`.

mod append_stream;
mod environment;
mod framed_session;
mod in_process;
mod session_channels;
mod session_stream;
mod snapshots;
