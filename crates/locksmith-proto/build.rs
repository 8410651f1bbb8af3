//! Generates the Rust code of the gRPC APIs: locksmith's own
//! (`proto/locksmith/v1/locksmith.proto`), the members' Raft traffic
//! (`proto/locksmith/raft/v1/raft.proto`) and, with the `etcd` feature, the
//! part of etcd's v3 API that the etcd backend calls (`proto/etcd/`).
//!
//! protoc always comes from the `protoc-bin-vendored` crate, never from the
//! machine: a build must not need a system protoc or its include files (a
//! fresh machine has neither, and `scripts/check-hermetic-build` keeps it so).
//! Only where that crate has no binary for the platform does `PROTOC` name
//! the protoc to use.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let protoc = match protoc_bin_vendored::protoc_bin_path() {
        Ok(path) => path,
        Err(unsupported) => {
            println!("cargo:rerun-if-env-changed=PROTOC");
            std::env::var_os("PROTOC")
                .map(PathBuf::from)
                .ok_or_else(|| format!("{unsupported}; set PROTOC to a protoc executable"))?
        }
    };
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(&protoc);
    tonic_prost_build::configure()
        // A message that does not decode is the sender's error (src/codec.rs).
        .codec_path("crate::ProtoCodec")
        // A backup is sent as slices of one buffer, not copied into each
        // message.
        .bytes(".locksmith.raft.v1.SnapshotBytes.data")
        .file_descriptor_set_path(out.join("locksmith_descriptor.bin"))
        .compile_with_config(
            config,
            &[
                "proto/locksmith/v1/locksmith.proto",
                "proto/locksmith/raft/v1/raft.proto",
            ],
            &["proto"],
        )?;
    if std::env::var_os("CARGO_FEATURE_ETCD").is_some() {
        // Clients only: nothing here serves etcd's API.
        let mut config = tonic_prost_build::Config::new();
        config.protoc_executable(&protoc);
        tonic_prost_build::configure()
            .build_server(false)
            .compile_with_config(
                config,
                &[
                    "proto/etcd/mvccpb/kv.proto",
                    "proto/etcd/etcdserverpb/rpc.proto",
                    "proto/etcd/v3lockpb/v3lock.proto",
                ],
                &["proto"],
            )?;
    }
    Ok(())
}
