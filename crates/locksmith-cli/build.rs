//! Compresses the shipped binary's debug sections at link time.
//!
//! The release profile keeps line tables for our own crates, so that a panic's
//! backtrace names files and lines; uncompressed they are three quarters of
//! the binary (74 of 109 MB). zlib-compressed sections (`SHF_COMPRESSED`) are
//! read by the standard library's backtraces, gdb, addr2line and perf alike,
//! and bring the binary under 50 MB. Cargo has no per-profile linker
//! arguments, hence a build script: release builds only (a debug build's
//! every link would pay for the compression), and only where the linker is
//! known to take the flag (GNU ld, gold, lld and mold on Linux).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let release = std::env::var("PROFILE").is_ok_and(|profile| profile == "release");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if release && linux {
        println!("cargo:rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
    }
}
