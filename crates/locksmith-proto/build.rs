//! Generates the Rust code of the gRPC API from `proto/locksmith/v1/locksmith.proto`
//! and of the members' Raft traffic from `proto/locksmith/raft/v1/raft.proto`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, so a fresh machine builds
//! without installing anything; set `PROTOC` to use another protoc.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-env-changed=PROTOC");
    println!("cargo:rerun-if-changed=proto");
    let protoc = match std::env::var_os("PROTOC") {
        Some(path) => PathBuf::from(path),
        None => protoc_bin_vendored::protoc_bin_path()?,
    };
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        // A message that does not decode is the sender's error (src/codec.rs).
        .codec_path("crate::ProtoCodec")
        .file_descriptor_set_path(out.join("locksmith_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                "proto/locksmith/v1/locksmith.proto",
                "proto/locksmith/raft/v1/raft.proto",
            ],
            &["proto"],
        )?;
    Ok(())
}
