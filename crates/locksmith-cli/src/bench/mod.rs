//! `locksmith bench` (being written).

/// Options of `locksmith bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {}

/// Runs the benchmark scenarios.
pub async fn bench(_args: BenchArgs) -> std::process::ExitCode {
    eprintln!("locksmith bench: not built yet");
    std::process::ExitCode::FAILURE
}
